#!/usr/bin/env python3
"""Write an F16 copy of a GGUF model: every quantized tensor dequantized (gguf.quants) to float16,
float32 ones and all metadata kept. The copy and its quantized original are a target / draft
pair with one vocabulary and nearly the same predictions, for bench/spec_draft.py on a machine
that holds no larger model of the same family.

    .venv/bin/python bench/f16_copy.py IN.gguf OUT.gguf
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from gguf.quants import dequantize
from synth_writer import copy_fields

_FLOAT = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


def write_f16_copy(src: str, dst: str) -> str:
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    wr = gguf.GGUFWriter(dst, arch)
    copy_fields(wr, r, lambda name: not name.startswith("GGUF.")
                and name not in ("general.architecture", "general.file_type"))
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for t in r.tensors:
        if t.tensor_type in _FLOAT:
            data = np.asarray(t.data)
        else:
            data = dequantize(t.data, t.tensor_type).astype(np.float16)  # numpy order [rows, cols]
        wr.add_tensor(t.name, data)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(write_f16_copy(sys.argv[1], sys.argv[2]))
