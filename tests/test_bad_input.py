"""Every bad input through the real CLI (`python -m stabray ...` in a subprocess): exit code 2, one
line on stderr naming the problem, no traceback, and nothing created on the way (no mlflow.db, no
empty folder, no half-written file). The cases run a few at a time; each fails before any training.

Also here: a crafted checkpoint never runs its code, and a dead Ray address is reported within
seconds (in-process: Ray reads the address file under its temp dir, which the test points at a
temporary folder)."""

# ruff: noqa: E501  (the table keeps one case per line)
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
BASE = str(ROOT / "sweeps" / "_base.yaml")


def spec(**over) -> dict:
    s = {
        "include": BASE,
        "name": "bad",
        "task": {"name": "dijkstra", "params": {"n_nodes": 4, "decimals": 1}, "train_size": 16, "val_size": 4},
        "model": {"preset": "tiny"},
        "device": "cpu",
    }
    s.update(over)
    return s


def write(path: Path, content) -> None:
    """A file in a case folder: text, bytes, a dict (YAML), or None for a folder."""
    if content is None:
        path.mkdir(parents=True)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict | list):
        path.write_text(yaml.safe_dump(content))
    else:
        path.write_text(content)


# (id, argv, files of the case folder, or a callable(folder, fixtures), fragments of the message)
# fmt: off
CASES = [
    # -- sweep: overrides
    ("set_not_yaml", ["sweep", "dijkstra", "--set", "train.epochs=[1,"], {}, ["--set train.epochs=[1,", "not valid YAML"]),
    ("set_through_number", ["sweep", "dijkstra", "--set", "train.lr.x=1"], {}, ["--set train.lr.x=1", "not a mapping"]),
    ("set_without_value", ["sweep", "dijkstra", "--set", "train.epochs"], {}, ["--set", "expected KEY=VALUE"]),
    ("set_unknown_key", ["sweep", "dijkstra", "--set", "train.epochz=3"], {}, ["--set train.epochz=3", "unknown key; did you mean epochs?"]),
    ("set_out_of_range", ["sweep", "dijkstra", "--set", "train.epochs=0"], {}, ["--set train.epochs=0", "greater"]),
    ("position_option_without_random", ["sweep", "dijkstra", "--set", "model.position_span_min=1"], {}, ["position_span_min applies to positions: random only"]),
    ("random_positions_on_gpt2", ["sweep", "s.yaml"], {"s.yaml": spec(model={"preset": "tiny", "family": "gpt2", "positions": "random"})}, ["s.yaml", "positions 'random' needs family qwen2"]),
    ("cuda_without_a_gpu_request", ["sweep", "dijkstra", "--set", "device=cuda"], {}, ["--set device=cuda", "device: cuda", "asks for 0 GPUs (resources.gpu)"]),
    ("gpu_request_removed_by_set", ["sweep", "s.yaml", "--set", "resources.gpu=0"], {"s.yaml": spec(device="cuda", resources={"gpu": 1})}, ["--set resources.gpu=0", "device: cuda", "asks for 0 GPUs"]),
    ("heads_do_not_divide_the_width", ["sweep", "dijkstra", "--set", "model.num_heads=5"], {}, ["model", "hidden_size 64 is not a multiple of num_heads 5"]),
    ("odd_head_size_under_rope", ["sweep", "dijkstra", "--set", "model.hidden_size=100"], {}, ["model", "25 per head is odd; RoPE (family qwen2)"]),
    ("long_size_not_a_number", ["sweep", "dijkstra", "--set", "task.params.long_sizes=[5, a]"], {}, ["--set task.params.long_sizes=[5, a]", "long_sizes: every entry (a n_nodes value) must be an integer in 2..1000, got 'a'"]),
    ("num_samples_zero", ["sweep", "dijkstra", "--num-samples", "0"], {}, ["--num-samples 0", "num_samples"]),
    ("method_unknown", ["sweep", "dijkstra", "--method", "alg2"], {}, ["--method alg2", "unknown method"]),
    ("method_not_listed", ["sweep", "dijkstra_methods", "--method", "mtp"], {}, ["--method mtp", "not one of them"]),
    # -- sweep: spec files
    ("spec_name_unknown", ["sweep", "dijkstr"], {}, ["no sweep spec 'dijkstr'", "did you mean dijkstra"]),
    ("spec_file_missing", ["sweep", "missing.yaml"], {}, ["sweep spec not found: missing.yaml"]),
    ("spec_is_folder", ["sweep", "s.yaml"], {"s.yaml": None}, ["s.yaml", "is a directory"]),
    ("spec_not_text", ["sweep", "s.yaml"], {"s.yaml": b"\xff\xfe\x00\x01"}, ["s.yaml", "not a text sweep spec"]),
    ("spec_not_yaml", ["sweep", "s.yaml"], {"s.yaml": "name: x\ntask: {name: dijkstra\n"}, ["s.yaml", "not valid YAML"]),
    ("spec_is_list", ["sweep", "s.yaml"], {"s.yaml": "- a\n- b\n"}, ["s.yaml", "a mapping of keys"]),
    ("spec_unknown_key", ["sweep", "s.yaml"], {"s.yaml": spec(trian={"epochs": 1})}, ["s.yaml", "trian: unknown key; did you mean train?"]),
    ("spec_unknown_key_far", ["sweep", "s.yaml"], {"s.yaml": spec(train={"epochs": 1, "steps": 2})}, ["s.yaml", "train.steps: unknown key; the keys here are batch_size, epochs,", "weight_decay"]),
    ("spec_unknown_task", ["sweep", "s.yaml"], {"s.yaml": spec(task={"name": "dijkstar"})}, ["task.name", "dijkstar"]),
    ("include_missing", ["sweep", "s.yaml"], {"s.yaml": {**spec(), "include": "nope.yaml"}}, ["include", "nope.yaml"]),
    ("include_by_spec_name", ["sweep", "s.yaml"], {"s.yaml": {**spec(), "include": "dijkstra"}}, ["include", "file not found: dijkstra (an include is a path relative to this file; the shipped spec 'dijkstra' is", "sweeps/dijkstra.yaml)"]),
    ("include_number", ["sweep", "s.yaml"], {"s.yaml": {**spec(), "include": 5}}, ["include", "a file name", "5"]),
    ("include_mapping", ["sweep", "s.yaml"], {"s.yaml": {**spec(), "include": [{"a": 1}]}}, ["include", "file name"]),
    ("include_folder", ["sweep", "s.yaml"], {"d": None, "s.yaml": {**spec(), "include": "d"}}, ["include", "not a file"]),
    ("include_cycle", ["sweep", "s.yaml"], {"s.yaml": {**spec(), "include": "s.yaml"}}, ["include", "cycle"]),
    # -- sweep: search spaces (every value a distribution can produce, before Ray)
    ("randint_outside_allowed_bits", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "alg1"}, search={"space": {"bits": {"randint": [1, 8]}}})}, ["search.space.bits", "randint [1, 8] can produce 5", "bits must be one of"]),
    ("uniform_on_integer_bits", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "alg1"}, search={"space": {"bits": {"uniform": [1, 4]}}})}, ["search.space.bits", "can produce 2.5"]),
    ("loguniform_reversed", ["sweep", "s.yaml"], {"s.yaml": spec(search={"space": {"lr": {"loguniform": [1e-3, 1e-4]}}})}, ["search.space.lr", "reversed"]),
    ("loguniform_from_zero", ["sweep", "s.yaml"], {"s.yaml": spec(search={"space": {"lr": {"loguniform": [0.0, 1e-3]}}})}, ["search.space.lr", "must be > 0"]),
    ("uniform_empty", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "alg1"}, search={"space": {"lam": {"uniform": [0.5, 0.5]}}})}, ["search.space.lam", "empty or reversed"]),
    ("randint_reversed", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "alg1"}, search={"space": {"bits": {"randint": [4, 2]}}})}, ["search.space.bits", "reversed"]),
    ("choice_empty", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "alg1"}, search={"space": {"lam": {"choice": []}}})}, ["search.space.lam", "empty list"]),
    # -- sweep: method hyperparameters and stability settings
    ("method_quantizer_unknown", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "alg1", "params": {"quantizer": "lsqq"}})}, ["quantizer must be one of", "'lsqq'"]),
    ("method_flag_not_bool", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "coconut", "params": {"reset_optimizer": "maybe"}}, search={"space": {"lam": None, "bits": None}})}, ["reset_optimizer must be true or false", "'maybe'"]),
    ("implicit_unit_unknown", ["sweep", "s.yaml"], {"s.yaml": spec(method={"name": "implicit_cot", "params": {"unit": "words"}}, search={"space": {"lam": None, "bits": None}})}, ["unit must be 'steps' or 'tokens'", "'words'"]),
    ("eaf_chain_unknown", ["sweep", "dijkstra", "--set", "eval.eaf_chain=own"], {}, ["--set eval.eaf_chain=own", "'gold' or 'generated'"]),
    ("icl_last_target_unknown", ["sweep", "icl_linear", "--set", "task.params.last_target=theta"], {}, ["last_target must be 'star' or 'gd'", "'theta'"]),
    ("space_value_not_a_distribution", ["sweep", "dijkstra", "--set", "search.space.lr=0.01"], {}, ["--set search.space.lr=0.01", "search.space.lr: expected a distribution", "{choice: [0.01]}"]),
    # -- sweep: objectives a trial would not report (Ray would fail the sweep at the first result)
    ("objective_of_another_runner", ["sweep", "dijkstra", "--set", "search.metric=val_infer_star"], {}, ["search.metric", "a per-epoch metric that dijkstra trials report", "'val_infer_star'"]),
    ("chain_objective_without_a_chain", ["sweep", "dijkstra", "--set", "search.metric=steps_val_acc", "--method", "no_cot"], {}, ["search.metric", "steps_val_acc scores the written chain", "method 'no_cot' does not write"]),
    ("chain_objective_compressed", ["sweep", "dijkstra", "--set", "search.metric=steps_val_acc"], {}, ["search.space.lam", "value 0.1", "method 'alg1' does not write"]),
    ("eaf_objective_every_other_epoch", ["sweep", "dijkstra", "--set", "search.metric=val_eaf", "--set", "search.mode=min", "--set", "eval.eaf_every=2"], {}, ["search.metric", "every eval.eaf_every = 2 epochs", "eval.eaf_every: 1"]),
    ("eaf_objective_without_a_chain", ["sweep", "dijkstra", "--set", "search.metric=val_eaf", "--set", "search.mode=min", "--method", "no_cot"], {}, ["search.metric", "'no_cot' answers without a chain", "no val_eaf"]),
    ("eaf_objective_on_the_generated_chain", ["sweep", "dijkstra", "--set", "search.metric=val_eaf", "--set", "search.mode=min", "--set", "eval.eaf_chain=generated"], {}, ["search.metric", "eval.eaf_chain: generated", "not a measured 0", "set eval.eaf_chain: gold"]),
    ("icl_eaf_objective_one_step", ["sweep", "icl_linear", "--set", "task.params.T_max=1", "--set", "search.metric=val_eaf", "--set", "search.mode=min"], {}, ["search.metric", "task.params.T_max 1", "an empty sum", "optimise val_acc"]),
    ("loss_maximised", ["sweep", "dijkstra", "--set", "search.metric=train_loss"], {}, ["--set search.metric=train_loss", "search.mode: max, but train_loss is better lower", "set search.mode: min"]),
    ("eaf_maximised_in_a_pareto_search", ["sweep", "dijkstra_pareto", "--set", "search.modes=[max, max]"], {}, ["--set search.modes=[max, max]", "search.modes.1: max, but val_eaf is better lower", "set search.modes: [max, min]"]),
    ("metric_beside_metrics", ["sweep", "dijkstra_pareto", "--set", "search.metric=val_eaf"], {}, ["--set search.metric=val_eaf", "metric 'val_eaf' with mode 'max' beside metrics", "which optimise it 'min'", "metrics: null, modes: null"]),
    ("metric_not_among_metrics", ["sweep", "dijkstra_pareto", "--set", "search.metric=train_loss"], {}, ["--set search.metric=train_loss", "metric 'train_loss' beside metrics", "would be ignored", "list it in metrics"]),
    ("mode_beside_modes", ["sweep", "dijkstra_pareto", "--set", "search.mode=min"], {}, ["--set search.mode=min", "with mode 'min' beside metrics", "would be ignored", "set mode: max to keep the lists"]),
    ("sampler_for_a_random_search", ["sweep", "dijkstra_pareto", "--set", "search.searcher=random"], {}, ["--set search.searcher=random", "sampler 'nsga2' is Optuna's, but searcher is 'random'", "sampler: null"]),
    # -- sweep: a search.stop_if rule that could never act
    ("stop_rule_unknown_metric", ["sweep", "dijkstra", "--set", "search.stop_if=[{metric: val_ac, epoch: 1, when: '< 0.1'}]"], {}, ["search.stop_if.0.metric", "a per-epoch metric that dijkstra trials report", "did you mean val_acc"]),
    ("stop_rule_past_the_end", ["sweep", "dijkstra", "--set", "search.stop_if=[{metric: val_acc, epoch: 500, when: '< 0.1'}]"], {}, ["search.stop_if.0.epoch", "500 is not before the last epoch", "never act"]),
    ("stop_rule_infinite_bound", ["sweep", "dijkstra", "--set", "search.stop_if=[{metric: val_acc, epoch: 1, when: '< 1e999'}]"], {}, ["search.stop_if.0.when", "1e999 is not a finite number"]),
    ("stop_rule_not_a_comparison", ["sweep", "dijkstra", "--set", "search.stop_if=[{metric: val_acc, epoch: 1, when: 'below 0.1'}]"], {}, ["search.stop_if.0.when", "a comparison and a number", "'below 0.1'"]),
    ("stop_rule_departure_compressed", ["sweep", "dijkstra", "--set", "search.stop_if=[{metric: val_departure_tok0, epoch: 1, when: '>= 0.5'}]"], {}, ["search.space.lam", "value 0.1", "val_departure_tok0 scores the written chain"]),
    ("stop_rule_departure_past_the_step", ["sweep", "lego_cyclic", "--method", "sft_cot", "--set", "task.params.trace=delta_op", "--set", "search.stop_if=[{metric: val_departure_tok7, epoch: 1, when: '>= 0.5'}]"], {}, ["search.stop_if.0.metric", "at most 3 tokens", "val_departure_tok0 to val_departure_tok3"]),
    ("stop_rule_eaf_not_measured_then", ["sweep", "dijkstra", "--set", "eval.eaf_every=3", "--set", "search.stop_if=[{metric: val_eaf, epoch: 2, when: '> 100'}]"], {}, ["search.stop_if.0.metric", "every eval.eaf_every = 3 epochs", "(epoch 2 among them)"]),
    ("two_distributions", ["sweep", "s.yaml"], {"s.yaml": spec(search={"space": {"lr": {"choice": [1e-3], "uniform": [1e-3, 2e-3]}}})}, ["search.space.lr", "exactly one of"]),
    # -- sweep: where results go, what it joins
    ("storage_is_file", ["sweep", "s.yaml", "--storage", "f"], {"f": "x", "s.yaml": spec()}, ["--storage", "a file"]),
    ("address_not_an_address", ["sweep", "s.yaml", "--address", "garbage"], {"s.yaml": spec()}, ["--address garbage", "not a Ray address", "host:port"]),
    ("bool_as_a_number", ["sweep", "dijkstra", "--set", "train.epochs=true"], {}, ["--set train.epochs=true", "train.epochs: must be a number, got true"]),
    ("spec_duplicate_key", ["sweep", "s.yaml"], {"s.yaml": "name: x\ntask: {name: dijkstra}\ntrain:\n  epochs: 80\n  epochs: 8\n"}, ["s.yaml", "found the key 'epochs' twice (first on line 4)", "line 5"]),
    ("set_duplicate_key", ["sweep", "dijkstra", "--set", "train={epochs: 2, epochs: 3}"], {}, ["--set train=", "found the key 'epochs' twice"]),
    ("pretrained_path_missing", ["sweep", "dijkstra", "--set", "model.pretrained=/nonexistent/model", "--set", "model.init_std=null"], {}, ["--set model.pretrained=/nonexistent/model", "no such directory"]),
    ("pretrained_beside_an_embedded_field", ["sweep", "dijkstra", "--set", "model.pretrained=/nonexistent/model"], {}, ["--set model.pretrained=/nonexistent/model", "init_std 0.1 applies to the embedded decoder only", "set init_std: null"]),
    ("pretrained_with_digit_numbers", ["sweep", "s.yaml"], {"s.yaml": spec(model={"pretrained": "some/hub-model", "numbers": "digits"})}, ["s.yaml", "numbers 'digits' applies to the embedded decoder only", "set numbers: word"]),
    ("pretrained_empty", ["sweep", "dijkstra", "--set", "model.pretrained=''", "--set", "model.init_std=null"], {}, ["--set model.pretrained=''", "pretrained is empty"]),
    ("lora_on_the_embedded_model", ["sweep", "dijkstra", "--set", "model.lora={rank: 4}"], {}, ["model: lora applies to a pretrained model"]),
    ("set_a_searched_field", ["sweep", "dijkstra", "--set", "method.params.lam=0.5"], {}, ["--set method.params.lam=0.5", "searches this field (search.space.lam)", "search.space.lam=null"]),
    ("storage_under_a_file", ["sweep", "s.yaml", "--storage", "f/runs"], {"f": "x", "s.yaml": spec()}, ["--storage", "f is a file, not a directory"]),
    ("storage_s3_without_bucket", ["sweep", "s.yaml", "--storage", "s3://"], {"s.yaml": spec()}, ["--storage s3://", "no bucket in the URI"]),
    ("seed_negative", ["sweep", "s.yaml", "--set", "seed=-1"], {"s.yaml": spec()}, ["--set seed=-1", "seed", "greater than or equal to 0"]),
    ("data_seed_too_large", ["sweep", "s.yaml", "--set", "task.data_seed=4294967296"], {"s.yaml": spec()}, ["task.data_seed", "less than 4294967296"]),
    ("name_too_long", ["sweep", "s.yaml"], {"s.yaml": spec(name="x" * 300)}, ["s.yaml", "name", "300 characters long; at most 100"]),
    ("resume_nothing", ["sweep", "s.yaml", "--resume"], {"s.yaml": spec()}, ["--resume", "no earlier sweep 'bad'"]),
    ("resume_record_damaged", ["sweep", "s.yaml", "--resume"], {"s.yaml": spec(), "stabray_runs": None, "stabray_runs/bad-20260101-000000": None, "stabray_runs/bad-20260101-000000/stabray_sweep.json": '{"tracking_uri": '}, ["--resume", "bad-20260101-000000/stabray_sweep.json is damaged (not JSON"]),
    ("resume_record_not_stabray", ["sweep", "s.yaml", "--resume"], {"s.yaml": spec(), "stabray_runs": None, "stabray_runs/bad-20260101-000000": None, "stabray_runs/bad-20260101-000000/stabray_sweep.json": '{"tracking_uri": "x", "groups": []}'}, ["--resume", "not a stabray sweep record", "experiment, parent_run_id, groups"]),
    ("dry_run_resume_nothing", ["sweep", "s.yaml", "--resume", "--dry-run"], {"s.yaml": spec()}, ["--resume", "no earlier sweep 'bad'"]),
    ("dry_run_resume_record_damaged", ["sweep", "s.yaml", "--resume", "--dry-run"], {"s.yaml": spec(), "stabray_runs": None, "stabray_runs/bad-20260101-000000": None, "stabray_runs/bad-20260101-000000/stabray_sweep.json": '{"tracking_uri": '}, ["--resume", "bad-20260101-000000/stabray_sweep.json is damaged (not JSON"]),
    ("dry_run_resume_store_gone", ["sweep", "s.yaml", "--resume", "--dry-run"], {"s.yaml": spec(), "stabray_runs": None, "stabray_runs/bad-20260101-000000": None, "stabray_runs/bad-20260101-000000/stabray_sweep.json": '{"tracking_uri": "foo://bar", "experiment": "bad", "parent_run_id": "p", "groups": {}}'}, ["no store for 'foo' URIs"]),
    ("tracking_uri_unknown_scheme", ["sweep", "s.yaml", "--tracking-uri", "foo://bar"], {"s.yaml": spec()}, ["tracking store foo://bar", "no store for 'foo' URIs"]),
    ("dry_run_more_gpus_than_this_machine", ["sweep", "s.yaml", "--dry-run", "--set", "resources.gpu=64"], {"s.yaml": spec()}, ["resources.gpu: each trial asks for 64 GPU, but this machine has", "RAY_ADDRESS=local"]),
    ("more_cpus_than_this_machine", ["sweep", "s.yaml", "--set", "resources.cpu=4096"], {"s.yaml": spec()}, ["resources.cpu: each trial asks for 4096 CPU, but this machine has", "join a cluster with --address"]),
    ("dry_run_checks_the_store", ["sweep", "s.yaml", "--dry-run", "--tracking-uri", "foo://bar"], {"s.yaml": spec()}, ["no store for 'foo' URIs"]),
    ("dry_run_checks_the_storage", ["sweep", "s.yaml", "--dry-run", "--storage", "f/runs"], {"f": "x", "s.yaml": spec()}, ["--storage", "f is a file, not a directory"]),
    # /proc takes no new files, for root too: permission bits would not have said so
    ("storage_cannot_be_created", ["sweep", "s.yaml", "--storage", "/proc/stabray_runs"], {"s.yaml": spec()}, ["--storage /proc/stabray_runs", "cannot create files in /proc"]),
    ("dry_run_storage_cannot_be_created", ["sweep", "s.yaml", "--dry-run", "--storage", "/proc/stabray_runs"], {"s.yaml": spec()}, ["--storage /proc/stabray_runs", "cannot create files in /proc"]),
    ("tracking_db_cannot_be_created", ["sweep", "s.yaml", "--tracking-uri", "sqlite:////proc/m.db"], {"s.yaml": spec()}, ["tracking store sqlite:////proc/m.db", "cannot create files in /proc"]),
    ("tracking_db_driver_missing", ["report", "--experiment", "x", "--tracking-uri", "mysql://u@127.0.0.1:1/db"], {}, ["cannot open the MLflow store mysql://", "database driver is not installed (SQLAlchemy found no module 'MySQLdb'; pip install mysqlclient)"]),
    ("tracking_server_down", ["sweep", "s.yaml", "--tracking-uri", "http://127.0.0.1:1"], {"s.yaml": spec()}, ["cannot reach the MLflow tracking server at http://127.0.0.1:1"]),
    ("tracking_db_not_sqlite", ["sweep", "s.yaml", "--tracking-uri", "m.db"], {"m.db": "garbage" * 10, "s.yaml": spec()}, ["m.db", "not an SQLite database"]),
    ("tracking_db_is_folder", ["sweep", "s.yaml", "--tracking-uri", "m.db"], {"m.db": None, "s.yaml": spec()}, ["m.db: a directory, not an MLflow database"]),
    ("tracking_db_folder_missing", ["sweep", "s.yaml", "--tracking-uri", "sqlite:///nowhere/m.db"], {"s.yaml": spec()}, ["nowhere", "does not exist"]),
    ("ray_address_dead", ["sweep", "s.yaml", "--address", "127.0.0.1:{port}"], {"s.yaml": spec()}, ["no Ray cluster answers at 127.0.0.1:", "--address local"]),
    ("dry_run_ray_address_dead", ["sweep", "s.yaml", "--dry-run", "--address", "127.0.0.1:{port}"], {"s.yaml": spec()}, ["no Ray cluster answers at 127.0.0.1:", "--address local"]),
    ("dry_run_address_not_an_address", ["sweep", "s.yaml", "--dry-run", "--address", "garbage"], {"s.yaml": spec()}, ["--address garbage", "not a Ray address"]),
    # -- data
    ("data_unknown_task", ["data", "dijkstar"], {}, ["unknown task 'dijkstar'", "did you mean 'dijkstra'"]),
    ("data_out_folder_missing", ["data", "dijkstra", "--out", "nowhere/x.jsonl"], {}, ["--out", "nowhere", "does not exist"]),
    ("data_out_is_folder", ["data", "dijkstra", "--out", "d"], {"d": None}, ["--out d", "is a directory"]),
    ("data_out_exists", ["data", "dijkstra", "--out", "x.jsonl"], {"x.jsonl": "mine\n"}, ["x.jsonl", "--force"]),
    ("data_out_cannot_be_created", ["data", "dijkstra", "--out", "/proc/x.jsonl"], {}, ["--out /proc/x.jsonl", "cannot create files in /proc"]),
    ("data_bad_param", ["data", "dijkstra", "--param", "n_nodes=abc"], {}, ["n_nodes must be an integer"]),
    ("data_unknown_param", ["data", "dijkstra", "--param", "n_nodse=4"], {}, ["unknown parameter 'n_nodse'; did you mean n_nodes?"]),
    ("data_unknown_flag", ["data", "dijkstra", "--set", "n_nodes=3"], {}, ["stabray data: unrecognized arguments: --set n_nodes=3", "see stabray data --help"]),
    ("data_param_not_a_number", ["data", "dijkstra", "--param", "p=abc"], {}, ["task 'dijkstra': p must be a finite number, got 'abc'"]),
    ("data_seed_negative", ["data", "dijkstra", "--seed", "-1"], {}, ["--seed must be in 0..2**32-1, got -1"]),
    ("set_task_param_wrong_type", ["sweep", "dijkstra", "--set", "task.params.labels=[12]"], {}, ["--set task.params.labels=[12]", "labels must be an integer, got [12]"]),
    ("data_size_too_large", ["data", "dijkstra", "--param", "n_nodes=100000"], {}, ["n_nodes must be an integer in 2..1000, got 100000"]),
    ("data_n_zero", ["data", "dijkstra", "--n", "0"], {}, ["--n must be >= 1"]),
    ("data_n_not_int", ["data", "dijkstra", "--n", "many"], {}, ["--n", "invalid int value: 'many'"]),
    # -- stability: checkpoints
    ("ckpt_crafted_pickle", ["stability", "ck"], lambda d, f: crafted_checkpoint(d, f), ["state.pt", "refused", "could run code"]),
    ("ckpt_state_truncated", ["stability", "ck"], lambda d, f: damage(d, f, "state.pt", 0.5), ["state.pt", "damaged"]),
    ("ckpt_state_missing", ["stability", "ck"], lambda d, f: damage(d, f, "state.pt", None), ["no state.pt"]),
    ("ckpt_tokenizer_truncated", ["stability", "ck"], lambda d, f: damage(d, f, "tokenizer/tokenizer.json", 0.3), ["tokenizer", "cannot load"]),
    ("ckpt_config_truncated", ["stability", "ck"], lambda d, f: damage(d, f, "trial_config.json", 0.5), ["trial_config.json", "not valid JSON"]),
    ("ckpt_config_missing", ["stability", "ck"], lambda d, f: damage(d, f, "trial_config.json", None), ["no trial_config.json"]),
    ("ckpt_config_unknown_key", ["stability", "ck"], lambda d, f: edit_config(d, f, bogus=1), ["trial_config.json", "bogus", "unknown key"]),
    ("ckpt_shape_mismatch", ["stability", "ck"], lambda d, f: edit_config(d, f, model={"preset": "tiny", "hidden_size": 64}), ["does not fit the model"]),
    ("stability_run_id_unknown", ["stability", "0123456789abcdef"], {}, ["'0123456789abcdef'", "no MLflow store"]),
    ("stability_target_is_file", ["stability", "f.txt"], {"f.txt": "x"}, ["f.txt", "a file, not a checkpoint"]),
    ("stability_target_missing", ["stability", "runs/ck"], {}, ["runs/ck", "no such checkpoint directory"]),
    ("stability_out_exists", ["stability", "ck", "--out", "o"], lambda d, f: with_outputs(d, f), ["stability.csv exists", "--force"]),
    ("stability_out_is_file", ["stability", "ck", "--out", "o"], lambda d, f: with_outputs(d, f, as_file=True), ["--out o", "a file"]),
    ("stability_out_cannot_be_created", ["stability", "ck", "--out", "/proc/o"], lambda d, f: damage(d, f, None, None), ["--out /proc/o", "cannot create files in /proc"]),
    ("stability_T_negative", ["stability", "ck", "--T", "-1"], lambda d, f: damage(d, f, None, None), ["--T must be >= 1", "got -1"]),
    ("stability_n_zero", ["stability", "ck", "--n", "0"], lambda d, f: damage(d, f, None, None), ["--n", ">= 1"]),
    # -- report, icl-figures, ui, tasks, the command itself
    ("report_no_store", ["report", "--experiment", "dijkstra"], {}, ["no MLflow store", "mlflow.db"]),
    ("report_unknown_scheme", ["report", "--experiment", "x", "--tracking-uri", "foo://bar"], {}, ["no store for 'foo' URIs"]),
    ("stability_unknown_scheme", ["stability", "0123456789abcdef", "--tracking-uri", "foo://bar"], {}, ["no store for 'foo' URIs"]),
    ("ui_unknown_scheme", ["ui", "--tracking-uri", "foo://bar", "--no-wait"], {}, ["no store for 'foo' URIs"]),
    ("reproduce_dry_run_checks_the_store", ["reproduce", "table1", "--dry-run", "--tracking-uri", "foo://bar"], {}, ["no store for 'foo' URIs"]),
    ("reproduce_dry_run_checks_the_storage", ["reproduce", "table1", "--dry-run", "--storage", "f/runs"], {"f": "x"}, ["--storage", "f is a file, not a directory"]),
    ("report_unknown_experiment", ["report", "--experiment", "nosuch", "--tracking-uri", "{F}/store.db"], {}, ["no MLflow experiment 'nosuch'"]),
    ("report_no_trials", ["report", "--experiment", "exists", "--tracking-uri", "{F}/store.db"], {}, ["experiment 'exists': no trials to report"]),
    ("report_objectives_one", ["report", "--experiment", "exists", "--tracking-uri", "{F}/store.db", "--objectives", "foo"], {}, ["--objectives foo", "expected METRIC:max or METRIC:min"]),
    ("report_objectives_single", ["report", "--experiment", "exists", "--tracking-uri", "{F}/store.db", "--objectives", "val_acc:max"], {}, ["--objectives val_acc:max", "at least two objectives"]),
    ("report_store_not_sqlite", ["report", "--experiment", "x", "--tracking-uri", "m.db"], {"m.db": "garbage" * 10}, ["not an SQLite database"]),
    ("report_ray_dir_missing", ["report", "--experiment", "x", "--ray-dir", "nowhere"], {}, ["--ray-dir nowhere", "no such directory"]),
    ("report_ray_dir_empty", ["report", "--experiment", "x", "--ray-dir", "d"], {"d": None}, ["--ray-dir d", "no Ray Tune trials"]),
    ("report_ray_dir_bad_params", ["report", "--experiment", "x", "--ray-dir", "d"], {"d": None, "d/t0": None, "d/t0/params.json": '{"task": '}, ["params.json", "not a readable JSON file"]),
    ("report_ray_dir_params_list", ["report", "--experiment", "x", "--ray-dir", "d"], {"d": None, "d/t0": None, "d/t0/params.json": "[1, 2]"}, ["params.json", "expected a JSON dict"]),
    ("report_out_not_empty", ["report", "--experiment", "x", "--out", "o"], {"o": None, "o/mine.md": "x"}, ["--out o", "--force"]),
    ("report_out_is_file", ["report", "--experiment", "x", "--out", "o"], {"o": "x"}, ["--out o", "a file"]),
    ("report_out_cannot_be_created", ["report", "--experiment", "x", "--out", "/proc/o"], {}, ["--out /proc/o", "cannot create files in /proc"]),
    ("reproduce_out_cannot_be_created", ["reproduce", "table1", "--dry-run", "--out", "/proc/o"], {}, ["--out /proc/o", "cannot create files in /proc"]),
    ("icl_figures_no_store", ["icl-figures", "nope"], {}, ["'nope' is not a directory", "no MLflow store"]),
    ("icl_figures_wrong_task", ["icl-figures", "ck"], lambda d, f: damage(d, f, None, None), ["dijkstra", "icl_linear or icl_quadratic"]),
    ("icl_figures_out_exists", ["icl-figures", "nope", "--out", "o"], {"o": None, "o/icl_figures.json": "mine"}, ["o/icl_figures.json exists", "--force"]),
    ("icl_figures_out_is_file", ["icl-figures", "nope", "--out", "o"], {"o": "x"}, ["--out o", "a file, not a directory"]),
    ("icl_figures_out_cannot_be_created", ["icl-figures", "nope", "--out", "/proc/o"], {}, ["--out /proc/o", "cannot create files in /proc"]),
    ("ui_optuna_not_sqlite", ["ui", "--optuna", "x.db", "--no-wait"], {"x.db": "garbage" * 10}, ["--optuna x.db", "not an SQLite database"]),
    ("ui_optuna_not_a_study", ["ui", "--optuna", "x.db", "--no-wait"], lambda d, f: sqlite_without_studies(d / "x.db"), ["--optuna x.db", "without an Optuna study"]),
    ("ui_host_not_an_address", ["ui", "--host", "999.1.1.1", "--no-wait"], {}, ["--host 999.1.1.1", "not a host name or address"]),
    ("ui_port_invalid", ["ui", "--port", "70000"], {}, ["--port 70000", "1-65535"]),
    ("ui_port_taken", ["ui", "--port", "{busy}", "--no-wait"], {}, ["127.0.0.1:", "in use", "--port"]),
    # -- stores, storage and addresses a run would meet only after Ray started
    ("dry_run_deleted_experiment", ["sweep", "s.yaml", "--dry-run", "--tracking-uri", "{F}/store.db", "--set", "mlflow.experiment=gone"], {"s.yaml": spec()}, ["MLflow experiment 'gone'", "is deleted", "mlflow experiments restore --experiment-id"]),
    ("sweep_deleted_experiment", ["sweep", "s.yaml", "--tracking-uri", "{F}/store.db", "--set", "mlflow.experiment=gone"], {"s.yaml": spec()}, ["MLflow experiment 'gone'", "is deleted"]),
    ("report_deleted_experiment", ["report", "--experiment", "gone", "--tracking-uri", "{F}/store.db"], {}, ["MLflow experiment 'gone'", "is deleted"]),
    ("experiment_name_too_long", ["sweep", "s.yaml", "--dry-run", "--set", "mlflow.experiment=" + "a" * 501], {"s.yaml": spec()}, ["has 501 characters", "at most 500"]),
    ("tracking_uri_in_memory", ["sweep", "s.yaml", "--tracking-uri", "sqlite://"], {"s.yaml": spec()}, ["tracking store sqlite://", "an in-memory database"]),
    ("tracking_uri_memory_file", ["sweep", "s.yaml", "--dry-run", "--tracking-uri", "sqlite:///:memory:"], {"s.yaml": spec()}, [":memory:", "an in-memory database"]),
    ("tracking_uri_two_slashes", ["sweep", "s.yaml", "--dry-run", "--tracking-uri", "sqlite://m.db"], {"s.yaml": spec()}, ["tracking store sqlite://m.db", "not sqlite:/// and a path"]),
    ("tracking_uri_unknown_user", ["sweep", "s.yaml", "--tracking-uri", "~nouser_stabray/m.db"], {"s.yaml": spec()}, ["~nouser_stabray/m.db", "cannot expand the ~"]),
    ("storage_unknown_user", ["sweep", "s.yaml", "--dry-run", "--storage", "~nouser_stabray/runs"], {"s.yaml": spec()}, ["--storage ~nouser_stabray/runs", "cannot expand the ~"]),
    ("report_store_empty_file", ["report", "--experiment", "x", "--tracking-uri", "m.db"], {"m.db": ""}, ["no MLflow store at", "an empty file"]),
    ("address_ray_client_without_host", ["sweep", "s.yaml", "--dry-run", "--address", "ray://"], {"s.yaml": spec()}, ["--address ray://", "no host"]),
    ("too_few_distinct_questions", ["sweep", "s.yaml"], {"s.yaml": spec(task={"name": "dijkstra", "params": {"n_nodes": 2, "decimals": 1}, "train_size": 16, "val_size": 2100})}, ["task 'dijkstra' at n_nodes=2: only", "distinct questions found for split 'val'", "(task.val_size)"]),
    # -- search spaces and values a trial would meet only inside Ray
    ("uniform_on_an_integer_field", ["sweep", "s.yaml", "--set", "search.space.train.batch_size={uniform: [8, 16]}"], {"s.yaml": spec()}, ["search.space.train.batch_size", "uniform [8.0, 16.0] can produce 12.94", "valid integer"]),
    ("method_name_searched", ["sweep", "s.yaml", "--set", "search.space.method.name={choice: [alg1, sft_cot]}"], {"s.yaml": spec()}, ["search.space.method.name", "not a search-space field", "methods:"]),
    ("weight_decay_infinite", ["sweep", "s.yaml", "--set", "train.weight_decay=.inf"], {"s.yaml": spec()}, ["--set train.weight_decay=.inf", "finite"]),
    ("sequence_past_gpt2_positions", ["sweep", "s.yaml", "--set", "model.family=gpt2", "--set", "model.max_positions=16"], {"s.yaml": spec()}, ["--set model.max_positions=16", "model.max_positions: 16, but a dijkstra sequence at size 6 has", "learned positions of family gpt2"]),
    ("training_sequence_past_the_span", ["sweep", "s.yaml", "--dry-run", "--set", "model.positions=random", "--set", "model.position_span=16"], {"s.yaml": spec()}, ["model.position_span: 16 (the span randomized positions are drawn from)", "training sequence at size 4 has"]),
    ("coconut_training_view_past_the_span", ["sweep", "dijkstra", "--dry-run", "--method", "coconut", "--set", "search.space.lam=null", "--set", "search.space.bits=null", "--set", "model.positions=random", "--set", "model.position_span=70"], {}, ["--set model.position_span=70", "training sequence at size 4 has 74 tokens"]),
    ("coconut_later_stage_past_the_span", ["sweep", "s.yaml", "--dry-run"], {"s.yaml": spec(task={"name": "star_graph", "train_size": 16, "val_size": 4}, model={"preset": "tiny", "positions": "random", "position_span": 67}, method={"name": "coconut", "params": {"latents_per_step": 4, "max_stage": 2}}, train={"epochs": 4}, search={"num_samples": 1, "space": {"lam": None, "bits": None}})}, ["model.position_span: 67", "training sequence at size 5 has 68 tokens"]),
    ("method_empty", ["sweep", "s.yaml", "--dry-run", "--method", ""], {"s.yaml": spec()}, ["--method is empty"]),
    ("storage_empty", ["sweep", "s.yaml", "--storage", ""], {"s.yaml": spec()}, ["--storage is empty"]),
    ("section_error_names_the_right_set", ["sweep", "dijkstra", "--set", "model.init_std=0.2", "--set", "model.num_heads=3"], {}, ["error: --set model.num_heads=3 (spec", "not a multiple of num_heads 3"]),
    ("tasks_unknown", ["tasks", "dijkstar"], {}, ["unknown task 'dijkstar'"]),
    ("command_unknown", ["sweeep"], {}, ["invalid choice: 'sweeep'"]),
]
# fmt: on


# -- case set-ups that need the shared checkpoint ------------------------------------------------


def damage(case: Path, fx: Path, name: str | None, keep: float | None) -> None:
    """The shared checkpoint copied to ./ck, with `name` truncated to `keep` of its bytes (None: removed)."""
    shutil.copytree(fx / "ck", case / "ck")
    if name is None:
        return
    f = case / "ck" / name
    if keep is None:
        f.unlink()
    else:
        b = f.read_bytes()
        f.write_bytes(b[: int(len(b) * keep)])


def edit_config(case: Path, fx: Path, **change) -> None:
    damage(case, fx, None, None)
    f = case / "ck" / "trial_config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **change}))


def sqlite_without_studies(path: Path) -> None:
    import sqlite3

    with sqlite3.connect(path) as con:
        con.execute("create table t (x)")
    con.close()


def crafted_checkpoint(case: Path, fx: Path) -> None:
    damage(case, fx, None, None)
    shutil.copy(fx / "evil.pt", case / "ck" / "state.pt")


def with_outputs(case: Path, fx: Path, as_file: bool = False) -> None:
    damage(case, fx, None, None)
    if as_file:
        (case / "o").write_text("x")
    else:
        (case / "o").mkdir()
        (case / "o" / "stability.csv").write_text("T\n1\n")


class Evil:
    """A pickle that creates a file when unpickled (what a crafted checkpoint could do)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# -- running them ---------------------------------------------------------------------------------


def snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))}


def env(fx: Path) -> dict[str, str]:
    e = dict(os.environ, STABRAY_CACHE=str(fx / "cache"), PYTHONPATH=str(ROOT), RAY_ADDRESS="local")
    e.pop("MLFLOW_TRACKING_URI", None)
    return e


FIXTURES_AT_START: dict[str, tuple[int, int]] = {}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """A real checkpoint of a tiny untrained trial, its dataset cache, an MLflow store with one
    experiment, and a crafted state.pt whose unpickling would create `pwned`."""
    import torch
    from mlflow import MlflowClient

    from stabray.train import make_run

    fx = tmp_path_factory.mktemp("fixtures")
    task = {
        "name": "dijkstra",
        "params": {"n_nodes": 4, "decimals": 1},
        "train_size": 16,
        "val_size": 4,
        "test_size": 4,
    }
    cfg = {
        "task": task,
        "model": {"preset": "tiny"},
        "train": {"epochs": 1, "batch_size": 8},
        "eval": {"eaf_examples": 0, "long_splits": []},
        "device": "cpu",
        "cache_dir": str(fx / "cache"),
    }
    make_run(cfg).save(fx / "ck")
    torch.save({"model": Evil(fx / "pwned"), "trainer": {}}, fx / "evil.pt")
    client = MlflowClient(f"sqlite:///{fx / 'store.db'}")
    client.create_experiment("exists")
    client.delete_experiment(client.create_experiment("gone"))  # a deleted experiment keeps its name
    FIXTURES_AT_START.update(snapshot(fx))
    return fx


# One case of each kind runs as a real subprocess in the default suite; the rest run in this process
# through stabray.cli.main (the same code, minus ~1-4 s of imports each). `-m slow` runs them all as
# subprocesses.
SUBPROCESS = {
    "set_not_yaml", "method_not_listed", "spec_not_text", "randint_outside_allowed_bits", "storage_is_file",
    "tracking_server_down", "ray_address_dead", "data_out_exists", "ckpt_crafted_pickle",
    "ckpt_tokenizer_truncated", "stability_run_id_unknown", "report_unknown_experiment", "ui_port_taken",
    "command_unknown",
}  # fmt: skip
BY_ID = {c[0]: c for c in CASES}


@pytest.fixture(scope="module")
def setting(fixtures, tmp_path_factory):
    """Where cases run, the values their argv refers to, and a port some other program listens on."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    subst = {"{F}": str(fixtures), "{port}": str(free_port()), "{busy}": str(busy.getsockname()[1])}
    yield tmp_path_factory.mktemp("cases"), subst
    busy.close()


def prepare(case, root: Path, fx: Path, subst: dict[str, str], how: str) -> tuple[Path, list[str]]:
    cid, argv, files, _ = case
    d = root / f"{cid}-{how}"
    d.mkdir()
    if callable(files):
        files(d, fx)
    else:
        for name, content in files.items():
            write(d / name, content)
    args = []
    for a in argv:
        for k, v in subst.items():
            a = a.replace(k, v)
        args.append(a)
    return d, args


def run_subprocess(case, fx: Path, setting) -> tuple:
    """(exit code, stdout, stderr, files before, files after) of `python -m stabray <argv>`."""
    d, args = prepare(case, *setting[:1], fx, setting[1], "sub")
    before = snapshot(d)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "stabray", *args], cwd=d, env=env(fx), capture_output=True, text=True, timeout=120
        )
        res = (p.returncode, p.stdout, p.stderr)
    except subprocess.TimeoutExpired as e:  # e.g. a client retrying a dead server for minutes
        res = ("timed out after 120 s", str(e.stdout), str(e.stderr))
    return (*res, before, snapshot(d))


def run_in_process(case, fx: Path, setting, monkeypatch, capfd) -> tuple:
    """One case as a fresh `python -m stabray` would meet it: in particular with no Ray joined (an
    earlier test's sweep in this process leaves its instance up for the next one)."""
    import ray

    from stabray.cli import main

    ray.shutdown()
    d, args = prepare(case, *setting[:1], fx, setting[1], "in")
    before = snapshot(d)
    for k, v in env(fx).items():
        if k in ("STABRAY_CACHE", "RAY_ADDRESS"):
            monkeypatch.setenv(k, v)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(d)
    capfd.readouterr()
    try:
        rc = main(args)
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capfd.readouterr()
    return rc, out, err, before, snapshot(d)


@pytest.fixture(scope="module")
def subprocess_results(fixtures, setting):
    """The SUBPROCESS cases, three at a time: {id: result}."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(lambda cid: (cid, run_subprocess(BY_ID[cid], fixtures, setting)), sorted(SUBPROCESS)))


def check(case, result) -> None:
    cid, argv, _, fragments = case
    rc, out, err, before, after = result
    assert "Traceback" not in out + err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err[-2000:])
    # one error line, the last; before it at most the start of a progress step ("loading ck ...") or a
    # count's progress ("generating dijkstra val examples: 1107/2100 (3 s, about 3 s left)")
    assert lines and lines[-1].startswith("error: "), err[-2000:]
    progress = re.compile(r".*: \d+/\d+ (\(\d+ s, about \d+ s left\)|in \d+\.\d s)")
    assert all(line.endswith(" ...") or progress.fullmatch(line) for line in lines[:-1]), err[-2000:]
    for frag in fragments:
        assert frag in lines[-1], (frag, lines[-1])
    assert lines[-1].removeprefix("error: ") not in out, out[-2000:]  # said once, not also as a note
    assert after == before, f"files changed on the way to the error: {set(after) ^ set(before)}"


def test_at_least_40_cases_with_distinct_ids():
    ids = [c[0] for c in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids) and SUBPROCESS <= set(ids)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(case, fixtures, setting, subprocess_results, monkeypatch, capfd):
    if case[0] in SUBPROCESS:
        check(case, subprocess_results[case[0]])
    else:
        check(case, run_in_process(case, fixtures, setting, monkeypatch, capfd))


@pytest.mark.slow
def test_every_case_as_a_subprocess(fixtures, setting):
    """The whole table through the real CLI, each case its own process (about a minute on 2 cores)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(pool.map(lambda c: (c[0], run_subprocess(c, fixtures, setting)), CASES))
    failed = {}
    for case in CASES:
        try:
            check(case, results[case[0]])
        except AssertionError as e:
            failed[case[0]] = str(e)[:300]
    assert not failed, failed


def test_crafted_checkpoint_never_ran_and_fixtures_untouched(fixtures, setting, subprocess_results):
    """After the cases (the crafted checkpoint among them): its code never ran, no fixture changed."""
    assert not (fixtures / "pwned").exists()
    assert snapshot(fixtures) == FIXTURES_AT_START


def test_the_crafted_checkpoint_would_run_code(fixtures, tmp_path):
    """The checks above can fail: unpickled without restriction, the file does create its marker."""
    import torch

    marker = tmp_path / "pwned"
    torch.save({"model": Evil(marker), "trainer": {}}, tmp_path / "evil.pt")
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.exists()


def test_checkpoint_round_trip_uses_only_tensors_and_json(fixtures, tmp_path):
    """What `save` writes loads with weights_only=True; the history is JSON."""
    import torch

    from stabray.train import load_run

    state = torch.load(fixtures / "ck" / "state.pt", weights_only=True)
    assert set(state) == {"model", "trainer"}
    assert json.loads((fixtures / "ck" / "history.json").read_text()) == []
    run = load_run(fixtures / "ck")
    assert run.trainer.epoch == 0 and run.history == []


# -- a Ray address nothing answers at -----------------------------------------------------------


@pytest.fixture
def stale_ray_file(tmp_path, monkeypatch):
    """A `ray_current_cluster` left by a Ray instance that died, under a temporary RAY_TMPDIR; no
    RAY_ADDRESS; no running GCS processes seen (another Ray on this machine must not count); and no
    Ray joined by this process (an earlier test's sweep leaves its instance up for the next one)."""
    import ray
    from ray._private import services

    ray.shutdown()
    addr = f"127.0.0.1:{free_port()}"
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(addr)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset())
    return addr, tmp_path / "ray" / "ray_current_cluster"


def test_stale_ray_address_file_is_reported(stale_ray_file):
    import ray

    from stabray.errors import UserError
    from stabray.tune.sweep import init_ray, running_ray

    addr, file = stale_ray_file
    assert running_ray() == (addr, str(file))  # what ray.init(address="auto") would join
    assert not ray.is_initialized()
    with pytest.raises(UserError) as e:
        init_ray(None)
    msg = str(e.value)
    assert addr in msg and str(file) in msg and "--address local" in msg
    assert not ray.is_initialized()


def test_sweep_with_a_stale_ray_address_exits_2_creating_nothing(stale_ray_file, tmp_path, monkeypatch, capsys):
    from stabray.cli import main

    addr, _ = stale_ray_file
    work = tmp_path / "work"
    work.mkdir()
    write(work / "s.yaml", spec())
    monkeypatch.chdir(work)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["sweep", "s.yaml"]) == 2
    err = capsys.readouterr().err
    assert addr in err and "--address local" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in work.iterdir()) == ["s.yaml"]  # no mlflow.db, no stabray_runs


def test_an_address_is_checked_when_ray_is_already_initialised(tmp_path, monkeypatch, capsys):
    """A pipeline (or an earlier sweep) already joined Ray in this process: an explicit address that is
    malformed or names another cluster is refused before anything is made, not silently ignored (it
    was: `--address garbage` ran the sweep on the joined cluster)."""
    import ray

    from stabray.cli import main
    from stabray.tune.sweep import check_joined, host_port, init_ray

    started = not ray.is_initialized()
    init_ray("local")
    try:
        port = host_port(ray.get_runtime_context().gcs_address)[1]
        work = tmp_path / "work"
        work.mkdir()
        write(work / "s.yaml", spec())
        monkeypatch.chdir(work)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        cases = [
            ("garbage", "not a Ray address"),
            (f"127.0.0.1:{port + 1}", "already joined the Ray cluster"),  # another port here
            (f"10.255.255.1:{port}", "already joined the Ray cluster"),  # the same port on another machine
        ]
        for addr, message in cases:
            assert main(["sweep", "s.yaml", "--address", addr]) == 2
            err = capsys.readouterr().err
            assert f"--address {addr}" in err and message in err and len(err.strip().splitlines()) == 1
        assert sorted(p.name for p in work.iterdir()) == ["s.yaml"]  # no mlflow.db, no stabray_runs
        node = ray.util.get_node_ip_address()
        for fine in (None, "local", "auto", f"127.0.0.1:{port}", f"localhost:{port}", f"{node}:{port}"):
            check_joined(fine)
    finally:
        if started:
            ray.shutdown()


def test_dry_run_reports_a_stale_ray_address_too(stale_ray_file, tmp_path, monkeypatch, capsys):
    """`sweep --dry-run` checks where the sweep would run as the real run does: the stale recorded
    address is named, exit 2, and Ray is not started."""
    import ray

    from stabray.cli import main

    addr, file = stale_ray_file
    write(tmp_path / "s.yaml", spec())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["sweep", "s.yaml", "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    err = capsys.readouterr().err
    assert addr in err and str(file) in err and len(err.strip().splitlines()) == 1
    assert not ray.is_initialized()


def test_table3_study_refuses_to_overwrite_before_reading_the_store(tmp_path, monkeypatch, capsys):
    """`python -m analysis table3-study --out` keeps a table already there (exit 2, file unchanged)
    unless --force, and says so before it reads any store (there is none here)."""
    from analysis.cli import main as analysis_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "table3_study.csv").write_text("mine\n")
    assert analysis_main(["table3-study", "--experiment", "x", "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert "o/table3_study.csv exists; pass --force" in err and "Traceback" not in err
    assert (tmp_path / "o" / "table3_study.csv").read_text() == "mine\n"
    assert analysis_main(["table3-study", "--experiment", "x", "--out", "o", "--force"]) == 2
    assert "no MLflow store" in capsys.readouterr().err  # with --force it goes on, to the missing store


def test_unwritable_probes_the_nearest_existing_folder(tmp_path):
    """A folder this process can write to, or one still to be created below it, is fine; /proc (no new
    files, for root too) is named; a path under a file is left to the callers' own check."""
    from stabray.errors import unwritable

    assert unwritable(tmp_path) is None and unwritable(tmp_path / "a" / "b") is None
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind
    assert unwritable("/proc/stabray/x") == "cannot create files in /proc (No such file or directory)"
    (tmp_path / "f").write_text("x")
    assert unwritable(tmp_path / "f" / "sub") is None


def test_a_sweep_into_an_existing_database_that_takes_no_writes_is_refused(tmp_path, monkeypatch, capsys):
    """An existing tracking database in a folder that takes no new files (a read-only mount: SQLite
    writes its journal beside the database): a sweep, and its --dry-run, name it and exit 2 before
    anything starts; `stabray ui`'s check (create, no write) still lets it be browsed where it is. A
    read-only mount cannot be made in a test, so the probe answers as on one."""
    import sqlite3

    from stabray.cli import main
    from stabray.errors import UserError
    from stabray.tracking import check_store, store

    db = tmp_path / "ro" / "m.db"
    db.parent.mkdir()
    sqlite3.connect(db).close()  # a real (empty) SQLite file
    probe = store.unwritable
    monkeypatch.setattr(
        store,
        "unwritable",
        lambda p: f"cannot create files in {p} (Read-only file system)" if Path(p) == db.parent else probe(p),
    )
    uri = f"sqlite:///{db}"
    check_store(uri, create=True)  # browsing: read where it is
    with pytest.raises(UserError, match=r"a sweep writes to it, but cannot create files in .*/ro \(Read-only"):
        check_store(uri, create=True, write=True)
    write(tmp_path / "s.yaml", spec())
    monkeypatch.chdir(tmp_path)
    for extra in (["--dry-run"], []):
        assert main(["sweep", "s.yaml", "--tracking-uri", uri, *extra]) == 2
        err = capsys.readouterr().err
        assert f"tracking store {uri}: a sweep writes to it" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro", "s.yaml"]  # no stabray_runs, no mlruns


def test_did_you_mean_names_the_closest_choices_or_nothing():
    """The one hint behind every "did you mean" (config keys, task parameters, registry names, spec
    names): closest first, at most n, quoted on request, empty when nothing is close."""
    from stabray.errors import did_you_mean

    keys = ["epochs", "lr", "batch_size", "warmup_steps", "weight_decay"]
    assert did_you_mean("epohcs", keys) == "did you mean epochs?"
    assert did_you_mean("weight_decy", keys, quote=True) == "did you mean 'weight_decay'?"
    assert did_you_mean("qqq", keys) == "" == did_you_mean("qqq", keys, before="; ")
    assert did_you_mean("epohcs", keys, before="; ") == "; did you mean epochs?"
    specs = ["bfs", "dijkstra", "dijkstra_methods"]
    assert did_you_mean("dijkstra_method", specs, n=3) == "did you mean dijkstra_methods or dijkstra?"
    assert did_you_mean("dijkstra_method", specs, n=1) == "did you mean dijkstra_methods?"
    assert did_you_mean(3, ["3x", "y"], cutoff=0.5) == "did you mean 3x?"  # a YAML key need not be a string


def test_a_bucket_that_never_answers_is_an_error_after_the_wait(monkeypatch):
    """gs:// without Google credentials waits on a metadata server without end inside pyarrow; the storage
    check gives up after REACH_S (here 0.3 s) with one error naming the bucket."""
    import time

    import pyarrow.fs as pafs

    from stabray.errors import UserError
    from stabray.tune import storage

    class Hanging:
        def get_file_info(self, path):
            time.sleep(30)

    class FileSystem:  # pyarrow's type is immutable: the module's name is replaced instead
        @staticmethod
        def from_uri(uri):
            return Hanging(), uri.split("://", 1)[1]

    monkeypatch.setattr(pafs, "FileSystem", FileSystem)
    monkeypatch.setattr(storage, "REACH_S", 0.3)
    t0 = time.perf_counter()
    with pytest.raises(UserError, match=r"--storage gs://b/x: the bucket 'b' did not answer within 0.3 s"):
        storage.open_storage("gs://b/x", "--storage")
    assert time.perf_counter() - t0 < 5
    assert storage._answer_within(lambda: 7, 1) == 7
    with pytest.raises(OSError, match="denied"):  # an error of the call itself comes back as raised
        storage._answer_within(lambda: (_ for _ in ()).throw(PermissionError("denied")), 1)


def test_a_ray_client_address_needs_grpc(monkeypatch):
    """ray://host:port goes through Ray Client, which `ray.init` refuses without grpcio only after the sweep
    made its store; the address check refuses it first (and says how to install it)."""
    import importlib.util

    from stabray.errors import UserError
    from stabray.tune.sweep import check_address_form

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(UserError, match=r"--address ray://10.0.0.1:10001: .* pip install 'ray\[client\]'"):
        check_address_form("ray://10.0.0.1:10001")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "grpc" else real(name, *a))
    check_address_form("ray://10.0.0.1:10001")  # with grpcio: a client address is left to Ray
