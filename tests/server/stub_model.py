"""A model stand-in for fast in-process server tests: real engine and tokenizer, no kernels.

Its "forward" makes the next token a fixed function of the last one (greedy output is
predictable) with a few runners-up so logprobs and sampling have something to choose from.
"""

import numpy as np


class StubModel:
    """Duck-types the model interface the engine uses (vocab_size, context_length,
    kv_bytes_per_token, kv_host_bytes, allocate_kv, forward)."""

    def __init__(self, vocab_size: int, context_length: int = 256, first_token: int = 4,
                 delay_s: float = 0.0):
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.first_token = first_token  # lowest id the stub ever predicts (skips BOS/EOS/...)
        self.delay_s = delay_s  # per forward, to keep requests in flight in disconnect tests

    def kv_bytes_per_token(self) -> int:
        return 64

    def kv_host_bytes(self, num_blocks: int, block_size: int = 16) -> int:
        return 0

    def allocate_kv(self, num_blocks: int, block_size: int = 16):
        return []

    def next_token(self, tok: int) -> int:
        span = self.vocab_size - self.first_token
        return self.first_token + (int(tok) * 7 + 3) % span

    def forward(self, batch, kv) -> np.ndarray:
        if self.delay_s:
            import time

            time.sleep(self.delay_s)
        last = batch.token_ids[batch.logits_indices]  # [n_seqs]
        logits = np.zeros((len(last), self.vocab_size), dtype=np.float32)
        for r, t in enumerate(last):
            nxt = self.next_token(t)
            logits[r, nxt] = 8.0
            logits[r, self.first_token + (nxt + 1 - self.first_token) % (self.vocab_size - self.first_token)] = 6.0
        return logits
