"""Random-weight tensors into a gguf.GGUFWriter, for the synthetic benchmark models
(synth_gemma3.py, synth_moe.py): valid random blocks of any type, norms near 1."""

import gguf
import numpy as np

from edged.quant.synth import random_qtensor


def copy_fields(wr: gguf.GGUFWriter, reader: gguf.GGUFReader, keep) -> None:
    """Copy the metadata fields of `reader` whose names keep(name) accepts into `wr`, typed as read."""
    for name, f in reader.fields.items():
        if not keep(name):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            wr.add_array(name, f.contents())
        else:
            wr.add_key_value(name, f.contents(), f.types[0])


class SynthTensors:
    """Adds random tensors to `wr` (each from its own seed drawn from `seed`), then writes the file."""

    def __init__(self, wr: gguf.GGUFWriter, seed: int = 0):
        self.wr, self.rng = wr, np.random.default_rng(seed)

    def quant(self, name: str, qtype, shape: tuple) -> None:
        """A weight of numpy-order `shape` (2-D, or 3-D experts) in `qtype`."""
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        qt = random_qtensor(qtype, rows, cols, seed=int(self.rng.integers(1 << 30)), name=name)
        self.wr.add_tensor(name, qt.data.reshape(*shape[:-1], -1), raw_dtype=qtype)

    def norm(self, name: str, n: int) -> None:
        self.wr.add_tensor(name, self.rng.uniform(0.7, 1.3, n).astype(np.float32))

    def normal(self, name: str, shape: tuple, std: float) -> None:
        """A float32 tensor of N(0, std) values (routers)."""
        self.wr.add_tensor(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def finish(self) -> None:
        self.wr.write_header_to_file()
        self.wr.write_kv_data_to_file()
        self.wr.write_tensors_to_file()
        self.wr.close()
