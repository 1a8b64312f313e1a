"""ESM-2 protein embeddings: protein sequences in as bytes, one mean-pooled embedding out per sequence.

It needs an image with PyTorch (CUDA) and `transformers`, e.g. one built
`FROM nvcr.io/nvidia/pytorch:24.10-py3` with `pip install transformers`, and a GPU. The weights come
from the Hugging Face hub on first start into HF_HOME (model.yaml points it at the workspace); mount
them from a volume to start offline (see examples/weights-on-pvc).
"""

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from transformers import AutoModel, AutoTokenizer

CHECKPOINT = "facebook/esm2_t6_8M_UR50D"
device = "cuda" if torch.cuda.is_available() else "cpu"
tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
model = AutoModel.from_pretrained(CHECKPOINT).to(device).eval()


@batch
def embed(sequences: np.ndarray):
    texts = [sequence[0].decode() for sequence in sequences]
    tokens = tokenizer(texts, return_tensors="pt", padding=True).to(device)
    with torch.inference_mode():
        hidden = model(**tokens).last_hidden_state
    mask = tokens["attention_mask"].unsqueeze(-1)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    return {"embeddings": pooled.float().cpu().numpy()}


with Triton() as triton:
    triton.bind(
        model_name="ESM1",
        infer_func=embed,
        inputs=[Tensor(name="sequences", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="embeddings", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=16),
    )
    triton.serve()
