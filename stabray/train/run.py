"""The "text" trial runner: one trial on a text task from a config, without Ray or MLflow: data ->
tokenizer -> model -> method -> Trainer, plus validation, final evaluation, EAF and checkpoints.
The Ray trainable, the CLI and users' own scripts all reach it through `stabray.train.make_run`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from stabray.config import TrialConfig, parse_trial_config
from stabray.data.cache import cached_path, load_splits
from stabray.data.encode import Encoder
from stabray.data.tokenizer import build_tokenizer
from stabray.errors import UserError
from stabray.evaluate.generate import generate_per_input
from stabray.evaluate.metrics import evaluate_split
from stabray.methods import get_method
from stabray.models.build import LoraSpec, ModelSpec, build_model, load_tokenizer
from stabray.models.positions import set_length_ratio
from stabray.record import acc_metric, departure_metric, steps_metric, trivial_metric
from stabray.tasks import get_task
from stabray.train.loop import Trainer, pick_device
from stabray.train.runner import (
    CONFIG,
    RUNNERS,
    Runner,
    StabilityOptions,
    StabilityTable,
    one_line,
    read_state,
    save_state,
    state_misfit,
)


def model_spec(cfg: TrialConfig) -> ModelSpec:
    m = cfg.model
    lora = (
        LoraSpec(
            rank=m.lora.rank, alpha=m.lora.alpha, dropout=m.lora.dropout, target_modules=tuple(m.lora.target_modules)
        )
        if m.lora
        else None
    )
    return ModelSpec(
        pretrained=m.pretrained,
        lora=lora,
        preset=m.preset,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        intermediate_size=m.intermediate_size,
        max_positions=m.max_positions,
        family=m.family,
        positions=m.positions,
        position_span=m.position_span,
        position_eval_stride=(
            tuple(m.position_eval_stride) if isinstance(m.position_eval_stride, list) else m.position_eval_stride
        ),
        position_span_min=m.position_span_min,
        init_std=m.init_std,
        freeze_embeddings=m.freeze_embeddings,
    )


def _request(c: TrialConfig) -> dict[str, Any]:
    task = get_task(c.task.name, **c.task.params)
    return {
        "task": task,
        "sizes": {"train": c.task.train_size, "val": c.task.val_size, "test": c.task.test_size},
        "seed": c.task.data_seed,
        "splits": ("train", "val", "test", *task.long_splits(c.eval.long_splits)),
        "cache_dir": c.cache_dir,
    }


def read_splits(c: TrialConfig) -> dict[str, list]:
    """The splits a text trial reads (train, val, test and its long splits), from the dataset cache or
    generated into it: one definition for the trial and for a sweep's driver, which fills the cache
    while Ray starts."""
    return load_splits(**_request(c))


def validation_split(c: TrialConfig) -> list:
    """The trial's validation split alone, drawn as `read_splits` draws it (its own seed, and the
    first evaluation split drawn, so it is the same list) and not cached: for a driver whose trials
    run on other machines."""
    from stabray.data.splits import make_splits

    r = _request(c)
    return make_splits(r["task"], r["sizes"], r["seed"], ("val",))["val"]


def split_texts(data: dict[str, list]) -> list[str]:
    """Every text of `data`'s examples a model reads or writes: what the embedded tokenizer is built on."""
    return [t for exs in data.values() for e in exs for t in (e.question, e.question_nohint, e.answer)]


def fresh_split(c: TrialConfig, task, data: dict[str, list], epoch: int) -> list:
    """Epoch `epoch`'s (>= 1) fresh training split under task.resample_train: a draw of its own
    seed, none of its questions in an evaluation split of `data`; the same list wherever drawn."""
    from stabray.data.splits import draw

    exclude = {e.question for s, exs in data.items() if s != "train" for e in exs}
    return draw(
        task,
        f"train-epoch{epoch}",
        c.task.train_size,
        c.task.data_seed,
        task.in_dist_sizes,
        exclude=exclude,
        probs=task.train_size_probs_at(epoch),
    )


def method_texts(method, examples: list) -> list[str]:
    """The task text of `examples` a model trained by `method` reads and writes: its question (No CoT's
    without the hint) and its target (every step and the final answer, or No CoT's final alone;
    compression keeps some of the steps, differently every epoch, so all of them are read). A
    method's own marker tokens (Coconut's) are in every vocabulary and are not task text."""
    if method.chain_at_eval:
        return [t for e in examples for t in (e.question, e.answer)]
    return [t for e in examples for t in (e.question_nohint, e.render_answer(None))]


def vocabulary_problem(tokenizer, examples: list, where: str, method, saved: bool = False) -> UserError | None:
    """The error for `examples` whose text (`method_texts`) holds tokens `tokenizer` lacks
    (`unknown_tokens`), which the model would read and be trained to write as `<unk>`; None when it
    reads them all. The embedded tokenizer's vocabulary is what the cached splits hold (and the
    integers 0..127 with model.numbers "word"): a number first seen in a fresh training split is
    unknown to it. `saved`: a checkpoint's tokenizer, whose vocabulary no setting can change."""
    from stabray.data.tokenizer import reads_every_number, unknown_tokens

    found = unknown_tokens(tokenizer, method_texts(method, examples))
    if not found:
        return None
    shown = ", ".join(f"{tok!r} ({n}x)" for tok, n in found.most_common(5))
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    numbers = not reads_every_number(tokenizer.get_vocab()) and any(tok[:1].isdigit() for tok in found)
    if saved:
        built = "the checkpoint's tokenizer (built from its training run's splits)"
        fix = "score it on text like its training run's; " + (
            "a model trained with model.numbers: digits reads every number"
            if numbers
            else "no setting adds tokens to it"
        )
    else:
        built = "the tokenizer (built from the cached splits)"
        fix = (
            "set model.numbers: digits (a number is one token per digit, so every number is known)"
            if numbers
            else "set task.resample_train: false (train on the cached split, whose text the tokenizer holds)"
        )
    return UserError(
        f"{where} holds {sum(found.values())} token(s) in {len(examples)} examples that {built} lacks and "
        f"would read as <unk>: {shown}{more}; {fix}"
    )


def first_fresh_problem(c: TrialConfig, data: dict[str, list]) -> UserError | None:
    """`vocabulary_problem` of the first fresh training split (epoch 1) under a tokenizer built as a
    trial builds it from `data`, for the config's method: for the sweep's driver, before any trial
    starts. None where it does not apply (no resample_train, a single epoch, a pretrained tokenizer)."""
    if not c.task.resample_train or c.train.epochs < 2 or c.model.pretrained is not None:
        return None
    tok = build_tokenizer(split_texts(data), numbers=c.model.numbers)
    task = get_task(c.task.name, **c.task.params)
    where = "task.resample_train: epoch 1's fresh training split"
    return vocabulary_problem(tok, fresh_split(c, task, data, 1), where, get_method(c.method.name, **c.method.params))


def splits_cached(c: TrialConfig) -> bool:
    """Whether the dataset cache holds the trial's splits (not read, so not checked)."""
    return cached_path(**_request(c)).exists()


@RUNNERS.register("text")
class TrialRun(Runner):
    """Build everything a trial needs. `tokenizer_dir` reuses a saved tokenizer (checkpoints)."""

    def __init__(self, config: dict[str, Any] | TrialConfig, tokenizer_dir: str | Path | None = None):
        self.cfg = config if isinstance(config, TrialConfig) else parse_trial_config(config)
        c = self.cfg
        if c.train.threads:
            torch.set_num_threads(c.train.threads)
        self.task = get_task(c.task.name, **c.task.params)
        self.method = get_method(c.method.name, **c.method.params)
        self.train_cfg = c.train
        self.device = pick_device(c.device)
        self.long_splits = self.task.long_splits(c.eval.long_splits)  # test_long, test_longer or test_n<k>
        self.data = read_splits(c)
        self.spec = model_spec(c)
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            try:
                self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exceptions; any failure = unusable files
                raise UserError(f"{tokenizer_dir}: cannot load the saved tokenizer ({one_line(e)})") from None
        elif self.spec.pretrained is None:
            self.tokenizer = build_tokenizer(split_texts(self.data), numbers=c.model.numbers)
        else:
            self.tokenizer = load_tokenizer(self.spec)
        # a vocabulary built from the task's text (here or by the run a saved one came from) holds only
        # what that text held: every split read now, and epoch 1's fresh split, must be covered (later
        # fresh splits are checked as they are drawn)
        self.built_tokenizer = self.spec.pretrained is None
        if self.built_tokenizer and tokenizer_dir is not None:
            for split, exs in self.data.items():
                where = f"split {split!r} (read with the saved tokenizer of {tokenizer_dir})"
                if (problem := vocabulary_problem(self.tokenizer, exs, where, self.method, saved=True)) is not None:
                    raise problem
        self.method.bind_tokenizer(self.tokenizer)  # e.g. Coconut adds <bot>/<eot> to a pretrained vocabulary
        self.encoder = Encoder(self.tokenizer)
        self.model = build_model(self.spec, self.tokenizer, seed=c.weights_seed)
        self.model = self.method.prepare(self.model).to(self.device)
        if c.model.init_seed is not None:  # what a method draws from torch's global RNG (jacreg's probes)
            torch.manual_seed(c.seed)  # follows the trial's seed, not the weights'
        # model.position_eval_stride a list: the length ratio its per-input stride rule reads, from the
        # training examples as the method encodes them (stabray.models.positions)
        set_length_ratio(self.model, self.length_pairs(self.data["train"][:500]))
        if self.built_tokenizer and tokenizer_dir is None and c.task.resample_train and c.train.epochs > 1:
            self.fresh_train(1)  # drawn now (and kept for epoch 1): a vocabulary problem before any training
        train_data = self.fresh_train if c.task.resample_train else self.data["train"]
        self.trainer = Trainer(
            self.model, self.method, self.encoder, train_data, self.train_cfg, seed=c.seed, device=self.device
        )
        self.eaf_tracker = None  # warm-start state of the EAF estimator between epochs
        self.history: list[dict[str, float]] = []  # per-epoch metrics (kept in checkpoints)

    def fresh_train(self, epoch: int):
        """Epoch `epoch`'s training split when task.resample_train is on: new questions every epoch,
        none of them in an evaluation split (epoch 0 is the cached training split). A built
        tokenizer must read every token of it (`vocabulary_problem`), else a UserError."""
        if epoch == 0:
            return self.data["train"]
        if getattr(self, "_fresh", (None,))[0] != epoch:
            exs = fresh_split(self.cfg, self.task, self.data, epoch)
            if self.built_tokenizer:
                problem = vocabulary_problem(
                    self.tokenizer, exs, f"task.resample_train: epoch {epoch}'s fresh training split", self.method
                )
                if problem is not None:
                    raise problem
            self._fresh = (epoch, exs)
        return self._fresh[1]

    def length_pairs(self, examples) -> Iterator[tuple[int, int]]:
        """(whole sequence tokens, prompt tokens) of each example as the method encodes it for
        evaluation (its prompt, its chain, the final answer); lazily, so a model that does not read
        them encodes nothing."""
        for e in examples:
            enc = self.encoder.encode(self.method.eval_prompt(e), self.method.eval_steps(e), e.final)
            yield len(enc.input_ids), enc.prompt_len

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self, split: str, n: int = 0, loss_gap: bool = False):
        exs = self.data[split][:n] if n else self.data[split]
        return evaluate_split(
            self.model,
            self.encoder,
            self.task,
            exs,
            self.method,
            device=self.device,
            loss_gap=loss_gap,
            batch_size=self.cfg.eval.batch_size,
        )

    def eval_encoded(self, split: str, n: int, chain: str = "gold"):
        """The first n examples of a split as the stability measure reads them: the method's
        evaluation prompt, then its gold chain (`Method.eval_steps`: the chain it trains on) and the
        final answer, or (chain="generated") the model's own greedy answer, steps and final."""
        exs = self.data[split][:n]
        prompts = [self.method.eval_prompt(e) for e in exs]
        if chain == "gold":
            return [self.encoder.encode(p, self.method.eval_steps(e), e.final) for p, e in zip(prompts, exs)]
        from stabray.data.encode import encode_generated

        gold = [self.encoder.encode(p, e.steps, e.final) for p, e in zip(prompts, exs)]
        max_new = max(len(g.input_ids) - g.prompt_len for g in gold) + 8
        gens = generate_per_input(
            self.method,
            self.model,
            self.encoder,
            prompts,
            max_new,
            batch_size=self.cfg.eval.batch_size,
            device=self.device,
        )
        return [encode_generated(self.encoder, p, g) for p, g in zip(prompts, gens)]

    def eaf(self, split: str = "val") -> float | None:
        """EAF on the first eval.eaf_examples of a split, on the chain eval.eaf_chain names; None
        when off, for a method that answers without a chain, and when the sum has no term
        (`EAFResult.measured`: no measured example's chain has an intermediate step, as at 3-4 nodes
        a Dijkstra answer can need none and a generated chain can be empty): an empty sum over
        steps, which would read as a measured 0 (perfectly stable) beside real values."""
        ev = self.cfg.eval
        if not ev.eaf_examples or not self.method.steps_at_eval:
            return None
        from stabray.stability import EAFTracker, estimate_eaf

        if self.eaf_tracker is None:
            self.eaf_tracker = EAFTracker()
        res = estimate_eaf(
            self.model,
            self.eval_encoded(split, ev.eaf_examples, ev.eaf_chain),
            iters=ev.eaf_iters,
            token_cap=ev.eaf_token_cap,
            aggregation=ev.eaf_aggregation,
            tracker=self.eaf_tracker,
            method=self.method,
        )
        return float(res.eaf) if res.measured else None

    def epoch(self) -> dict[str, float]:
        """Train one epoch, then validate: train_loss, val_acc (and for a method that writes the
        whole chain steps_val_acc and val_departure_tok<k>), eaf, times."""
        self.check_more_epochs()
        m = self.trainer.train_epoch()
        t0 = time.perf_counter()
        v = self.evaluate("val", self.cfg.eval.val_examples)
        m["val_acc"] = v.acc
        if v.steps_acc is not None:  # the written chain's learning curve beside the answer's
            m[steps_metric("val")] = v.steps_acc
        for token, share in (v.departures or {}).items():  # and at which token of a step it goes off
            m[departure_metric(token)] = share
        m["val_time_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        e = self.eaf("val") if self.eaf_due else None
        if e is not None:
            m["val_eaf"] = e
            m["eaf_time_s"] = time.perf_counter() - t0
        m["epoch"] = self.trainer.epoch
        self.history.append({k: v for k, v in m.items() if isinstance(v, float | int)})
        return m

    def final(self) -> dict[str, float]:
        """Test and length-generalization accuracy (test_acc, test_long_acc or test_acc_n<k>), each
        with the best trivial rule's accuracy on the same examples beside it (trivial_<metric>) and,
        for a method that writes the whole chain, how often the chain is right (steps_<metric>) and
        where the wrong ones go off (test_departure_tok<k>, ...); loss gap and EAF on the test split."""
        ev = self.cfg.eval
        # No CoT: both prefixes of the loss gap are the prompt, so it is 0 by construction: not logged
        t = self.evaluate("test", loss_gap=ev.loss_gap and self.method.chain_at_eval)
        out: dict[str, float] = {}
        if t.loss_gap is not None:
            out["test_loss_gap"] = t.loss_gap
        for s in ("test", *self.long_splits):
            r = t if s == "test" else self.evaluate(s)
            out[acc_metric(s)] = r.acc
            if r.steps_acc is not None:
                out[steps_metric(s)] = r.steps_acc
            for token, share in (r.departures or {}).items():
                out[departure_metric(token, s)] = share
        out.update(self.trivial_accuracy())
        e = self.eaf("test")
        if e is not None:
            out["test_eaf"] = e
        return out

    def trivial_accuracy(self) -> dict[str, float]:
        """trivial_<metric>: the best of the task's trivial rules on the examples each accuracy is read
        on: the validation examples `val_acc` scores (the first eval.val_examples, or all) and each
        test split (none if the task names no rule)."""
        out = {}
        n_val = self.cfg.eval.val_examples
        for s in ("val", "test", *self.long_splits):
            exs = self.data[s][:n_val] if s == "val" and n_val else self.data[s]
            rules = self.task.baseline_accuracy(exs)
            if rules:
                out[trivial_metric(s)] = max(rules.values())
        return out

    def decomposition(self, n: int, split: str = "test", max_T: int | None = None) -> list[dict[str, float]]:
        """The eq. (4) table (Table 2 columns) for T = 1 .. min(max_T, T_max) on n examples of a
        split, on the method's evaluation prompt and gold chain (Coconut: over its latent slots)."""
        from stabray.stability import decompose

        if not self.has_decomposition:
            raise UserError(self.no_chain_note())
        self.check_eval_args(split, n=n)
        ev = self.cfg.eval
        return decompose(
            self.model,
            self.encoder,
            self.data[split][:n],
            method=self.method,
            iters=ev.eaf_iters,
            token_cap=ev.eaf_token_cap,
            aggregation=ev.eaf_aggregation,
            seed=self.cfg.seed,
            max_T=max_T,
        )

    def no_chain_note(self) -> str:
        return (
            f"method {self.method.name!r} answers without a chain at evaluation: eq. (4)'s sums over "
            "intermediate steps are empty, so the EAF and the bound are 0 by definition, not measured; "
            "no table is reported"
        )

    def weight_noise(self, seeds: int, n: int = 64, split: str = "test", sigma: float = 0.005) -> float:
        """Appendix B.2: mean increase of the inference loss under N(0, sigma^2) weight noise."""
        from stabray.stability import inference_loss, weight_noise_stability

        self.check_eval_args(split, seeds=seeds, n=n)
        exs = self.data[split][:n]
        return weight_noise_stability(
            self.model, lambda m: inference_loss(m, self.encoder, exs, method=self.method), sigma=sigma, seeds=seeds
        )

    @property
    def has_decomposition(self) -> bool:
        return self.method.steps_at_eval

    def stability_table(self, opts: StabilityOptions) -> StabilityTable:
        """The eq. (4) table on the test split (Coconut: over its latent slots), up to opts.T."""
        from stabray.stability import decompose

        examples = self.data["test"][: opts.n]
        if not self.has_decomposition:
            return StabilityTable([], len(examples), self.no_chain_note())
        rows = decompose(
            self.model,
            self.encoder,
            examples,
            method=self.method,
            iters=opts.iters,
            token_cap=opts.token_cap,
            aggregation=opts.aggregation,
            include_question=opts.include_question,
            max_T=opts.T or None,
        )
        note = ""
        if self.method.latent_thoughts:
            note = (
                f"method {self.method.name!r} reasons in latent thoughts: its steps 1..L are the latent slots, "
                "whose true values are the text proxies of the steps they replace, and step L+1 is the answer; "
                "a latent has no loss of its own, so rows T <= L give eaf and sum_eps only"
            )
        return StabilityTable(rows, len(examples), note)

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.model.state_dict()
        if self.spec.pretrained is not None:  # keep what trains (LoRA, new embeddings), not the base
            trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
            state = {
                k: v
                for k, v in state.items()
                if k in trainable
                or "original" in k
                and k.replace(".parametrizations.weight.original", ".weight") in trainable
            }
        save_state(path, state, self.trainer.state_dict(), self.history)
        self.tokenizer.save_pretrained(str(path / "tokenizer"))
        (path / CONFIG).write_text(json.dumps(self.cfg.model_dump(), indent=1))

    def load(self, path: str | Path) -> None:
        """The checkpoint at `path` (from `save`) into this run: weights, optimizer, history. The run must
        read tokens as the checkpoint's model does: a run built from another dataset has another
        vocabulary (`stabray.train.load_run(path)` builds the run from the checkpoint's own)."""
        state, self.history = read_state(path, map_location=self.device)
        saved_tok = Path(path) / "tokenizer"
        if self.spec.pretrained is None and saved_tok.is_dir():
            from transformers import AutoTokenizer

            try:
                theirs = AutoTokenizer.from_pretrained(str(saved_tok)).get_vocab()
            except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exceptions; any failure = unusable files
                raise UserError(f"{saved_tok}: cannot load the saved tokenizer ({one_line(e)})") from None
            ours = self.tokenizer.get_vocab()
            moved = sum(ours.get(t) != i for t, i in theirs.items()) + len(set(ours) - set(theirs))
            if moved:
                raise UserError(
                    f"{path}: the checkpoint's tokenizer differs from this run's ({moved} of {len(theirs)} tokens "
                    "are missing or have other ids): the run reads another dataset; load it with "
                    "stabray.train.load_run(path), which builds the run with the checkpoint's tokenizer"
                )
        if self.spec.pretrained is None:
            try:
                self.model.load_state_dict(state["model"])
            except RuntimeError as e:
                raise state_misfit(path, e, "the model built from the run's config") from None
        else:  # the checkpoint holds what trains (see save); the base weights come from `pretrained`
            res = self.model.load_state_dict(state["model"], strict=False)
            saved = set(state["model"])
            trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
            lost = sorted(trainable - saved)  # parameter names are their state-dict keys
            if res.unexpected_keys or lost:
                raise UserError(
                    f"{path}: the saved weights do not fit {self.spec.pretrained}"
                    + (f"; unexpected: {res.unexpected_keys[:3]}" if res.unexpected_keys else "")
                    + (f"; missing trained weights: {lost[:3]}" if lost else "")
                )
        self.trainer.load_state_dict(state["trainer"])
