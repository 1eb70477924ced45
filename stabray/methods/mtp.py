"""Multi-token prediction (MTP, after Gloeckle et al. 2024): during training, extra
heads predict the tokens 2 .. k positions ahead; inference is ordinary next-token decoding.

`k` counts the tokens predicted at each position, the next one included: k = 2 adds one head (t+2),
k = 7 adds six (t+2 .. t+7). The heads live in one module, `model.mtp_heads`, attached by `prepare`,
so they are in `model.parameters()`, the optimizer and checkpoints; the model's forward pass and
`generate` never use them.

Head j (offset j = 2..k) reads the hidden state of layer `from_layer` (hidden_states index: -1 =
the last, after the final norm, i.e. what the LM head reads; 1 = after the first block, the
"shallow head" of the MTP planning paper's analysis) and maps it to logits through the model's own output
embedding (shared unembedding):
- `linear`: logits = unembed(W_j LN_j(h)), W_j a hidden x hidden matrix;
- `mlp`: logits = unembed(LN'_j(h + W2_j gelu(W1_j LN_j(h)))), a residual MLP of width 4 x hidden.

Loss: `CE_1 + mtp_weight * sum_{j=2..k} CE_j`, where CE_j is the mean cross entropy of head j's
logits at position t against the label at t + j, over the positions whose label is not ignored
(answer tokens; the prompt and padding are -100). The per-offset terms are summed, not averaged
(`mtp_weight = 1 / (k - 1)` averages them). CE_1 is the model's own next-token loss.

Combinable with Algorithm 1: `lam` / `strategy` compress the chain of thought exactly as alg1 does
(resampled every epoch; the stability measures use alg1's compressed gold chain, `eval_chain`), and
`bits` fake-quantizes the model's Linear layers (QAT, `quantizer`) - applied before the heads are
attached, so the heads, which inference never uses, stay full precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stabray.errors import UserError
from stabray.methods.alg1 import check_compression_qat, compress_indices, eval_indices, qat_model_problem
from stabray.methods.base import METHODS, Method
from stabray.methods.qat import apply_qat

HEADS = ("linear", "mlp")
IGNORE = -100


class OffsetHead(nn.Module):
    """Hidden state (B, L, H) -> a hidden state for the token `offset` positions ahead (B, L, H)."""

    def __init__(self, hidden: int, kind: str):
        super().__init__()
        self.kind = kind
        self.norm = nn.LayerNorm(hidden)
        if kind == "linear":
            self.proj = nn.Linear(hidden, hidden, bias=False)
        else:
            self.up = nn.Linear(hidden, 4 * hidden)
            self.down = nn.Linear(4 * hidden, hidden)
            self.out_norm = nn.LayerNorm(hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.kind == "linear":
            return self.proj(self.norm(h))
        return self.out_norm(h + self.down(F.gelu(self.up(self.norm(h)))))


class MTPHeads(nn.Module):
    """The k - 1 extra heads; heads[i] predicts offset i + 2."""

    def __init__(self, hidden: int, k: int, kind: str, from_layer: int):
        super().__init__()
        self.from_layer = from_layer
        self.heads = nn.ModuleList(OffsetHead(hidden, kind) for _ in range(k - 1))


def shifted_ce(logits: torch.Tensor, labels: torch.Tensor, offset: int) -> torch.Tensor:
    """Mean CE of logits at t (B, L, V) against labels at t + offset (B, L), ignoring -100."""
    lg = logits[:, :-offset].float()
    lb = labels[:, offset:]
    if (lb != IGNORE).sum() == 0:  # nothing to predict this far ahead in this batch
        return lg.sum() * 0.0
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lb.reshape(-1), ignore_index=IGNORE)


@dataclass(frozen=True)
class MTPParams:
    k: int = 4  # tokens predicted per position, the next one included (2..7): k - 1 extra heads
    head: str = "linear"  # extra head design: linear | mlp
    mtp_weight: float = 1.0  # weight of the summed extra-head losses (>= 0; 0 = plain NTP with idle heads)
    from_layer: int = -1  # hidden_states index the heads read: -1 = last (as the LM head), 1 = first block
    lam: float = 1.0  # Algorithm 1 compression: fraction of steps kept (1.0 = all)
    strategy: str = "random"  # which steps are kept: random | drop_first | drop_last | equal
    bits: int = 32  # QAT bit-width of the model's Linear layers (32 = off)
    quantizer: str = "lsq"  # lsq (learned per-channel step and offset) | fixed (stabray.methods.qat)
    quantize: str = "auto"  # QAT target: auto | lora | base | all_linear | merged (see stabray.methods.qat)
    eval_chain: str = "compressed"  # gold chain of the stability measures: compressed (as alg1) | full


@METHODS.register("mtp")
class MTP(Method):
    Params = MTPParams

    def validate(self) -> None:
        p = self.params
        if not (isinstance(p.k, int) and 2 <= p.k <= 7):
            raise UserError(f"method 'mtp': k must be an integer in 2..7, got {p.k!r}")
        if p.head not in HEADS:
            raise UserError(f"method 'mtp': head must be one of {HEADS}, got {p.head!r}")
        if not p.mtp_weight >= 0:
            raise UserError(f"method 'mtp': mtp_weight must be >= 0, got {p.mtp_weight}")
        check_compression_qat(self.name, p)

    def model_problem(self, model) -> str | None:
        return qat_model_problem(self.name, self.params, model)

    def prepare(self, model):
        p = self.params
        apply_qat(model, p.bits, p.quantize, p.quantizer)  # before the heads: they stay full precision
        hidden = model.get_output_embeddings().weight.shape[1]
        n_states = model.config.num_hidden_layers + 1  # embeddings + one per block
        if not -n_states <= p.from_layer < n_states:
            raise UserError(
                f"method 'mtp': from_layer must be in {-n_states}..{n_states - 1} for this "
                f"{n_states - 1}-layer model, got {p.from_layer}"
            )
        ref = model.get_output_embeddings().weight
        model.mtp_heads = MTPHeads(hidden, p.k, p.head, p.from_layer).to(device=ref.device, dtype=ref.dtype)
        return model

    def train_view(self, ex, epoch, rng):
        idx = compress_indices(len(ex.steps), self.params.lam, self.params.strategy, rng)
        return ex.question, tuple(ex.steps[i] for i in idx)

    def eval_steps(self, ex):  # the compressed gold chain, as Algorithm 1 (stabray.methods.alg1)
        p = self.params
        return tuple(ex.steps[i] for i in eval_indices(len(ex.steps), p.lam, p.strategy, ex.question, p.eval_chain))

    def losses(self, model, batch) -> list[torch.Tensor]:
        """[CE_1, CE_2, ..., CE_k] of one batch (CE_1 = next-token loss)."""
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        labels = batch["labels"]
        unembed = model.get_output_embeddings()
        mtp = model.mtp_heads
        h = out.hidden_states[mtp.from_layer]  # (B, L, H)
        ces = [shifted_ce(out.logits, labels, 1)]
        for j, head in enumerate(mtp.heads, start=2):
            ces.append(shifted_ce(unembed(head(h)), labels, j))
        return ces

    def loss(self, model, batch):
        ces = self.losses(model, batch)
        return ces[0] + self.params.mtp_weight * torch.stack(ces[1:]).sum()
