"""The simulated worker's model: no weights, no context; its plan (slots, context per slot)
from the flags, its vocabulary the simulator's (worker/simulate/vocab.py), its metadata saying
`simulated`. Stands where a LoadedModel (worker/runtime/model.py) stands in a worker's parts.
"""

from __future__ import annotations

from pathlib import Path

from scheduler.registry import ModelMeta
from worker.runtime.lora import LoraAdapters
from worker.runtime.model import ContextPlan, LoadedModel
from worker.runtime.settings import WorkerSettings
from worker.simulate.vocab import N_TOKENS, SimVocab

SIMULATED = "simulated"
"""What the registry, /props (model_ftype), /slots and /metrics say of a simulated worker."""
DEFAULT_SLOTS = 4
DEFAULT_N_CTX_SLOT = 8192
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class SimModel(LoadedModel):
    def __init__(self, settings: WorkerSettings, vocab: SimVocab) -> None:  # nothing loaded
        n_slots = settings.n_parallel if settings.n_parallel > 0 else DEFAULT_SLOTS
        n_ctx_slot = settings.ctx_size // n_slots if settings.ctx_size else DEFAULT_N_CTX_SLOT
        self.path = Path(settings.model or SIMULATED)
        self.model = None
        self.ctx = None
        self.memory = None
        self.vocab = vocab
        self.n_ctx_train = n_ctx_slot
        self.plan = ContextPlan(
            n_ctx=n_ctx_slot * n_slots, n_slots=n_slots, kv_unified=True,
            n_batch=settings.batch_size, n_ubatch=settings.ubatch_size, n_threads=1,
            n_threads_batch=1, swa_full=False, flash_attn="off", cache_type_k="f16",
            cache_type_v="f16")
        self.adapters = LoraAdapters.none()
        self.adapter_files: dict[str, Path] = {}
        self.projector = None
        self.fitted = None
        self.draft = None
        self.n_ctx = self.plan.n_ctx
        self.n_swa = 0
        self.rollback_only_full = False
        self.n_ctx_slot = n_ctx_slot

    def warmup(self) -> None:
        return None

    def meta_value(self, key: str) -> str | None:
        return None

    def meta(self) -> ModelMeta:
        return ModelMeta(vocab_type=0, n_vocab=N_TOKENS, n_ctx_train=self.n_ctx_train, n_embd=0,
                         n_params=0, size=0, chat_template=CHATML, model_ftype=SIMULATED)

    def ftype_name(self) -> str:
        return SIMULATED

    def close(self) -> None:
        return None
