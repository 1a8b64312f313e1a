"""Sentence embeddings from weights on a volume: the Hugging Face cache in HF_HOME (a read-only claim that
every replica mounts) is read offline, so pods download nothing. Loading takes a while before `Triton()`
exists; the model's status says Loading meanwhile.

It needs an image with PyTorch and `transformers` (a CPU build will do), e.g. `python:3.12-slim` with
`pip install torch transformers`.
"""

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from transformers import AutoModel, AutoTokenizer

CHECKPOINT = "sentence-transformers/all-MiniLM-L6-v2"
tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
model = AutoModel.from_pretrained(CHECKPOINT).eval()


@batch
def embed(texts: np.ndarray):
    tokens = tokenizer([text[0].decode() for text in texts], return_tensors="pt", padding=True)
    with torch.inference_mode():
        hidden = model(**tokens).last_hidden_state
    mask = tokens["attention_mask"].unsqueeze(-1)
    return {"embeddings": ((hidden * mask).sum(dim=1) / mask.sum(dim=1)).numpy()}


with Triton() as triton:
    triton.bind(
        model_name="Embedder",
        infer_func=embed,
        inputs=[Tensor(name="texts", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="embeddings", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=32),
    )
    triton.serve()
