"""Coconut, chain of continuous thought (Hao et al. 2024): a curriculum that replaces the leading
reasoning steps by latent thoughts, each the model's last hidden state fed back as the next input
embedding, between `<bot>` and `<eot>`.

Curriculum (the reference implementation, facebookresearch/coconut `dataset.py`): stage
s = epoch // epochs_per_stage, with a fresh optimizer and learning-rate schedule at every stage
switch (`reset_optimizer`, Hao et al.'s setting; off = one optimizer for the whole run). For
s <= max_stage the first s steps are replaced by s * c latents
(c = latents_per_step); beyond max_stage every language step is removed and max_stage * c latents
stay (or min(T, max_stage) * c with pad_to_max off). Stage 0 is the full chain behind an empty
`<bot><eot>`. The loss covers only the remaining language tokens (the markers and latents sit in
the prompt, whose labels are ignored).

Latents are computed by sequential passes (the reference's multi-pass scheme, recomputing the
prefix instead of reusing a KV cache): pass j runs the model on the embeddings up to the j-th
latent and writes the last hidden state of the position before it into that latent's slot;
a final pass over the whole sequence gives the loss. The writes are out of place, so gradients
flow through every latent into all earlier positions and layers. Cost: one prefix pass per latent
plus one full pass.

Evaluation runs the final stage: the question, `<bot>`, max_stage * c latents, `<eot>`, then greedy
decoding of "| final" (all language steps were removed in the last stage, so train the model for
at least (max_stage + 1) * epochs_per_stage epochs). Stability: each latent slot is a step
(stabray.stability: the EAF over latent slots; the eq. (4) table with the text proxy of the replaced
step as a latent's true value, `stabray.stability.decomposition.latent_errors`).

New tokens: the embedded tokenizer reserves `<bot>`, `<eot>`, `<latent>`; a pretrained tokenizer
gets them in `bind_tokenizer` (the embeddings are then resized). The embedded model trains every
weight. With LoRA the base embeddings are frozen, so `prepare` wraps the input embedding in peft's
TrainableTokens layer (peft 0.21, `inject_adapter_in_model(TrainableTokensConfig(...))`, adapter
"coconut_tokens"): only the `<bot>`/`<eot>` rows train, as a delta beside the LoRA adapter. (LoRA's own
`trainable_token_indices` would need the ids when the model is built; `<latent>`'s embedding is
never used, every latent slot is overwritten.)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from stabray.errors import UserError
from stabray.methods.base import METHODS, Method

BOT, EOT, LATENT = "<bot>", "<eot>", "<latent>"


@dataclass(frozen=True)
class CoconutParams:
    latents_per_step: int = 1  # c: latent thoughts replacing each step (Table 5 of the paper: 1)
    max_stage: int = 3  # steps replaced by latents at most (Hao et al.'s max_latent_stage)
    epochs_per_stage: int = 1  # epochs spent at each curriculum stage
    pad_to_max: bool = True  # final stage and evaluation: always max_stage * c latents (no peeking at T)
    reset_optimizer: bool = True  # Hao et al.: a fresh optimizer (and learning-rate schedule) at each stage switch


@METHODS.register("coconut")
class Coconut(Method):
    Params = CoconutParams

    def __init__(self, **params):
        self.ids: dict[str, int] | None = None  # token ids of BOT, EOT, LATENT (bind_tokenizer / prepare)
        super().__init__(**params)

    def validate(self) -> None:
        p = self.params
        for key in ("latents_per_step", "max_stage", "epochs_per_stage"):
            if getattr(p, key) < 1:
                raise UserError(f"method 'coconut': {key} must be >= 1, got {getattr(p, key)}")

    # -- curriculum ------------------------------------------------------------------------------
    def stage(self, epoch: int) -> int:
        return epoch // self.params.epochs_per_stage

    def plan(self, n_steps: int, stage: int) -> tuple[int, int]:
        """(steps removed, latent thoughts) for an example with n_steps steps at `stage`."""
        p = self.params
        if stage <= p.max_stage:
            return stage, stage * p.latents_per_step
        k = p.max_stage if p.pad_to_max else min(n_steps, p.max_stage)
        return n_steps, k * p.latents_per_step

    def view_epochs(self, epochs: int) -> tuple[int, ...]:
        """The first epoch of every stage the run reaches: a stage adds c latents per step it removes, so
        with c above a step's tokens a later stage's view is the longest."""
        per = self.params.epochs_per_stage
        return tuple(s * per for s in range(self.params.max_stage + 2) if s * per < epochs) or (0,)

    def on_train_step(self, step, steps_per_epoch):
        """At the first step of an epoch whose curriculum differs from the previous epoch's: a fresh
        optimizer and a fresh learning-rate schedule (warm-up, then its shape over the remaining
        steps), as Hao et al.'s `reset_optimizer` (their learning rate is constant)."""
        if not self.params.reset_optimizer or step == 0 or step % steps_per_epoch:
            return None
        e, last = step // steps_per_epoch, self.params.max_stage + 1  # stages past max_stage are one stage
        return "schedule" if min(self.stage(e), last) != min(self.stage(e - 1), last) else None

    @staticmethod
    def markers(n_latent: int) -> str:
        return BOT + LATENT * n_latent + EOT

    def train_view(self, ex, epoch, rng):
        skip, n_latent = self.plan(len(ex.steps), self.stage(epoch))
        return ex.question + self.markers(n_latent), tuple(ex.steps[skip:])

    def eval_prompt(self, ex):
        return ex.question + self.markers(self.plan(len(ex.steps), self.params.max_stage + 1)[1])

    def eval_steps(self, ex):
        return ()  # the final stage writes "| final"

    # -- tokens and trainable embeddings ---------------------------------------------------------
    def bind_tokenizer(self, tokenizer) -> None:
        missing = [t for t in (BOT, EOT, LATENT) if t not in tokenizer.get_vocab()]
        if missing:
            tokenizer.add_tokens(missing, special_tokens=True)
        self._take_ids(tokenizer)

    def _take_ids(self, tokenizer) -> None:
        ids = {}
        for t in (BOT, EOT, LATENT):
            enc = tokenizer(t, add_special_tokens=False)["input_ids"]
            if len(enc) != 1:
                raise UserError(
                    f"method 'coconut': the tokenizer does not keep {t} as one token "
                    f"(got {enc}); call method.bind_tokenizer(tokenizer) before building the model"
                )
            ids[t] = enc[0]
        self.ids = ids

    def _ids_without_tokenizer(self, model) -> None:
        """Fallback when the caller never bound a tokenizer: a pretrained model's own tokenizer
        (must already contain the markers), else the embedded tokenizer's reserved layout."""
        path = getattr(model.config, "name_or_path", "") or ""
        if path:
            from transformers import AutoTokenizer

            self._take_ids(AutoTokenizer.from_pretrained(path))
        else:
            from stabray.data.tokenizer import LATENT_TOKENS, SPECIALS

            self.ids = {t: len(SPECIALS) + LATENT_TOKENS.index(t) for t in (BOT, EOT, LATENT)}

    def prepare(self, model):
        if self.ids is None:
            self._ids_without_tokenizer(model)
        emb = model.get_input_embeddings()
        if emb.weight.shape[0] <= max(self.ids.values()):
            model.resize_token_embeddings(max(self.ids.values()) + 1)
            emb = model.get_input_embeddings()
        if not emb.weight.requires_grad:  # LoRA (or otherwise frozen embeddings): train the marker rows
            from peft import TrainableTokensConfig, inject_adapter_in_model

            name = next(n for n, m in model.named_modules() if m is emb).rsplit(".", 1)[-1]
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "multiple adapters": intended, LoRA + tokens
                inject_adapter_in_model(
                    TrainableTokensConfig(target_modules=[name], token_indices=[self.ids[BOT], self.ids[EOT]]),
                    base,
                    adapter_name="coconut_tokens",
                )
        return model

    # -- latent passes ---------------------------------------------------------------------------
    def fill_latents(self, model, ids, mask):
        """Input embeddings (B, L, D) with every latent slot holding the last hidden state of the
        position before it, computed left to right; plus the position ids (B, L)."""
        pos = (mask.long().cumsum(1) - 1).clamp_min(0)  # right- or left-padded rows alike
        x = model.get_input_embeddings()(ids)  # (B, L, D)
        lat = ids == self.ids[LATENT]  # (B, L)
        n = lat.sum(1)  # latents per row
        rank = lat.long().cumsum(1)  # j-th latent of a row has rank j + 1
        for j in range(int(n.max()) if lat.any() else 0):
            rows = (n > j).nonzero(as_tuple=True)[0]  # (R,)
            where = ((rank[rows] == j + 1) & lat[rows]).long().argmax(1)  # (R,) slot of latent j
            end = int(where.max())
            h = model(
                inputs_embeds=x[rows, :end],
                attention_mask=mask[rows, :end],
                position_ids=pos[rows, :end],
                output_hidden_states=True,
                logits_to_keep=1,
                use_cache=False,
            ).hidden_states[-1]  # (R, end, D)
            x = x.index_put((rows, where), h[torch.arange(len(rows), device=h.device), where - 1].to(x.dtype))
        return x, pos

    latent_thoughts = True

    def model_inputs(self, model, input_ids, attention_mask):
        if self.ids is None:
            raise UserError("method 'coconut': prepare(model) must run before evaluation")
        x, pos = self.fill_latents(model, input_ids, attention_mask)
        return {"inputs_embeds": x, "attention_mask": attention_mask, "position_ids": pos}

    def latent_slots(self, input_ids):
        return [p for p, t in enumerate(input_ids) if t == self.ids[LATENT]] if self.ids else []

    def loss(self, model, batch):
        if self.ids is None:
            raise UserError("method 'coconut': prepare(model) must run before training")
        x, pos = self.fill_latents(model, batch["input_ids"], batch["attention_mask"])
        return model(
            inputs_embeds=x,
            attention_mask=batch["attention_mask"],
            position_ids=pos,
            labels=batch["labels"],
            use_cache=False,
        ).loss

    @torch.no_grad()
    def generate(self, model, encoder, prompts, max_new_tokens, batch_size=64, device="cpu"):
        """Latent passes over the prompt (which ends in <bot> latents <eot>), then greedy decoding
        with a KV cache to EOS."""
        from stabray.data.encode import left_pad

        was_training = model.training
        model.eval()
        out: list[list[int]] = []
        for b in range(0, len(prompts), batch_size):
            batch = left_pad([encoder.prompt(p) for p in prompts[b : b + batch_size]], encoder.pad)
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            x, pos = self.fill_latents(model, ids, mask)
            res = model(inputs_embeds=x, attention_mask=mask, position_ids=pos, use_cache=True)
            cache, nxt = res.cache, res.logits[:, -1].argmax(-1)  # (B,); `cache` is transformers 5's name
            gen, done = [], torch.zeros_like(nxt, dtype=torch.bool)
            for _ in range(max_new_tokens):
                gen.append(nxt)
                done |= nxt == encoder.eos
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
                pos = pos[:, -1:] + 1
                res = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
                cache, nxt = res.cache, res.logits[:, -1].argmax(-1)
            for row in torch.stack(gen, 1).tolist():
                out.append(row[: row.index(encoder.eos)] if encoder.eos in row else row)
        model.train(was_training)
        return out
