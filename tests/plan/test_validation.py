"""Every plan validation rule: bad input gives one line naming the key, all problems are reported at once."""
import pytest

from npudist.plan import PlanError, load_plan

pytestmark = pytest.mark.timeout(60)


def errors_of(data, world_size=None, overrides=()):
    with pytest.raises(PlanError) as info:
        load_plan(data, overrides, world_size=world_size)
    err = info.value
    assert isinstance(err, ValueError)
    for line in err.errors:
        assert "\n" not in line
        assert str(err).count(line) == 1
    return err.errors


def one_error(data, key, *fragments, world_size=None, overrides=()):
    errs = errors_of(data, world_size, overrides)
    assert len(errs) == 1, errs
    assert errs[0].startswith(key + ": "), errs
    for f in fragments:
        assert f in errs[0], errs
    return errs[0]


def test_defaults_are_valid():
    plan = load_plan({}, world_size=4)
    assert plan.parallel.dp_shard_degree == 4


# --- keys and types ---------------------------------------------------------------------------------------

def test_unknown_section_suggests():
    one_error({"paralel": {}}, "paralel", 'did you mean "parallel"')


def test_unknown_nested_key_suggests():
    one_error({"parallel": {"tp_degre": 2}}, "parallel.tp_degre", 'did you mean "tp_degree"')
    one_error({"parallel": {"fsdp": {"reshard_after_fwd": True}}}, "parallel.fsdp.reshard_after_fwd",
              'did you mean "reshard_after_forward"')


def test_wrong_types():
    one_error({"model": {"dim": "big"}}, "model.dim", "expected an integer", "'big'")
    one_error({"model": {"dim": 64.0}}, "model.dim", "expected an integer")
    one_error({"model": {"tie_embeddings": "yes please"}}, "model.tie_embeddings", "true or false")
    one_error({"data": {"seq_len": True}}, "data.seq_len", "expected an integer")
    one_error({"parallel": {"fsdp": {"wrap": "layers.*"}}}, "parallel.fsdp.wrap", "a list of a string")
    one_error({"optimizer": {"betas": [0.9]}}, "optimizer.betas", "a list of 2 numbers")
    one_error({"parallel": {"tp": {"plan": {"output": "columnwise"}}}}, "parallel.tp.plan.output",
              'did you mean "colwise"')
    one_error({"parallel": "fsdp"}, "parallel", "expected a mapping")


def test_literal_choices_suggest_case_and_prefix():
    one_error({"parallel": {"pp": {"schedule": "1f1b"}}}, "parallel.pp.schedule", 'did you mean "1F1B"')
    one_error({"parallel": {"pp": {"schedule": "zbv"}}}, "parallel.pp.schedule", 'did you mean "ZBVZeroBubble"')
    one_error({"training": {"device": "gpu"}}, "training.device", "'npu', 'cpu'")


def test_float_accepts_yaml_exponent_strings():
    plan = load_plan({"optimizer": {"lr": "1e-3"}})   # YAML 1.1 reads 1e-3 as a string
    assert plan.optimizer.lr == 1e-3
    one_error({"optimizer": {"lr": "fast"}}, "optimizer.lr", "expected a finite number")


def test_invalid_yaml_reports_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model:\n  dim: 64\n parallel: [\n")
    errs = errors_of(str(f))
    assert len(errs) == 1 and "invalid YAML at line 3" in errs[0] and str(f) in errs[0]


def test_duplicate_yaml_key_reports_lines(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("model:\n  dim: 64\n  dim: 128\n")
    (err,) = errors_of(str(f))
    assert 'duplicate key "dim" (first defined on line 2)' in err and "line 3" in err


def test_plan_must_be_mapping(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text("- a\n- b\n")
    (err,) = errors_of(str(f))
    assert "must be a mapping of sections" in err


def test_missing_file():
    (err,) = errors_of("/nonexistent/plan.yaml")
    assert "cannot read plan file" in err


def test_empty_file_is_defaults(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing\n")
    assert load_plan(str(f), world_size=2).parallel.dp_shard_degree == 2


# --- degrees and world size -------------------------------------------------------------------------------

def test_degrees_must_multiply_to_world_size():
    one_error({"parallel": {"dp_shard_degree": 2, "tp_degree": 2}}, "parallel", "multiply to 4",
              "world size is 8", world_size=8)


def test_rest_degree_must_divide():
    one_error({"parallel": {"tp_degree": 3}, "model": {"n_heads": 3, "dim": 96, "n_kv_heads": 3,
                                                         "vocab_size": 258}},
              "parallel.dp_shard_degree", "-1 cannot be filled", world_size=4)


def test_degree_below_one():
    one_error({"parallel": {"tp_degree": 0}}, "parallel.tp_degree", ">= 1", world_size=4)
    one_error({"parallel": {"dp_shard_degree": -2}}, "parallel.dp_shard_degree", "-1 (= the rest)", world_size=4)


def test_world_size_inferred_from_concrete_degrees():
    plan = load_plan({"parallel": {"dp_shard_degree": 2, "tp_degree": 2}})
    assert plan.parallel.degrees().world_size == 4


def test_resolve_raises_value_error():
    from npudist.plan import ParallelConfig
    with pytest.raises(ValueError, match="parallel: degrees multiply to 2"):
        ParallelConfig(dp_shard_degree=2).resolve(4)
    assert ParallelConfig(tp_degree=2).resolve(8).dp_shard == 4


# --- tensor parallel --------------------------------------------------------------------------------------

def test_heads_not_divisible_by_tp():
    one_error({"parallel": {"tp_degree": 4}, "model": {"n_heads": 6, "dim": 96}}, "model.n_heads",
              "6 is not divisible by parallel.tp_degree=4", world_size=4)


def test_kv_heads_not_divisible_by_tp():
    one_error({"parallel": {"tp_degree": 2}, "model": {"n_heads": 4, "n_kv_heads": 1}}, "model.n_kv_heads",
              "1 is not divisible by parallel.tp_degree=2", world_size=2)


def test_ffn_and_vocab_not_divisible_by_tp():
    errs = errors_of({"parallel": {"tp_degree": 4}, "model": {"ffn_hidden_dim": 90, "vocab_size": 258}},
                     world_size=4)
    assert [e.split(":")[0] for e in errs] == ["model.ffn_hidden_dim", "model.vocab_size"]


def test_sequence_parallel_needs_divisible_seq_len():
    one_error({"parallel": {"tp_degree": 2, "tp": {"sequence_parallel": True}}, "data": {"seq_len": 127}},
              "parallel.tp.sequence_parallel", "data.seq_len=127", world_size=2)


def test_tp_pattern_must_match_a_module():
    one_error({"parallel": {"tp": {"plan": {"layers.*.atention.wq": "colwise"}}}},
              "parallel.tp.plan.layers.*.atention.wq", "matches no module", 'did you mean "layers.*.attention.wq"')


def test_fsdp_wrap_pattern_checked():
    one_error({"parallel": {"fsdp": {"wrap": ["layer.*"]}}}, "parallel.fsdp.wrap[0]", 'did you mean "layers.*"')
    one_error({"parallel": {"fsdp": {"wrap": ["layers..0"]}}}, "parallel.fsdp.wrap[0]", "empty segment")


# --- pipeline ---------------------------------------------------------------------------------------------

PP = {"parallel": {"pp_degree": 2, "dp_shard_degree": 1}, "data": {"micro_batch_size": 4,
                                                                    "global_batch_size": 8}}


def pp_plan(**pp):
    import copy
    d = copy.deepcopy(PP)
    d["parallel"]["pp"] = pp
    return d


def test_valid_pipeline_plan():
    plan = load_plan(pp_plan(schedule="1F1B", microbatches=2), world_size=2)
    assert plan.parallel.pp.num_stages(2) == 2


def test_microbatches_fewer_than_stages():
    one_error(pp_plan(microbatches=1), "parallel.pp.microbatches", "fewer than the 2 pipeline ranks",
              world_size=2)


def test_layers_not_divisible_by_stages():
    d = pp_plan(microbatches=2)
    d["model"] = {"n_layers": 5}
    one_error(d, "model.n_layers", "5 is not divisible by the 2 pipeline stages", world_size=2)


def test_more_stages_than_layers():
    d = pp_plan(microbatches=4, schedule="Interleaved1F1B", virtual_stages=4)
    d["model"] = {"n_layers": 6}
    one_error(d, "model.n_layers", "cannot fill 8 pipeline stages", world_size=2)


def test_split_points_allow_uneven_layers():
    d = pp_plan(microbatches=2, split_points=["layers.2"])
    d["model"] = {"n_layers": 5}
    assert load_plan(d, world_size=2).parallel.pp.split_points == [2]


def test_split_points_wrong_count_and_order():
    one_error(pp_plan(microbatches=2, split_points=[1, 2]), "parallel.pp.split_points", "needs 1 points",
              world_size=2)
    d = pp_plan(microbatches=4, schedule="Interleaved1F1B", virtual_stages=2, split_points=[2, 1, 3])
    one_error(d, "parallel.pp.split_points", "strictly increasing", world_size=2)
    one_error(pp_plan(microbatches=2, split_points=[4]), "parallel.pp.split_points", "[1, 3]", world_size=2)
    one_error(pp_plan(microbatches=2, split_points=["block.2"]), "parallel.pp.split_points[0]", "layers.N",
              world_size=2)


def test_schedule_needs_matching_virtual_stages():
    one_error(pp_plan(microbatches=2, schedule="Interleaved1F1B"), "parallel.pp.virtual_stages", ">= 2",
              world_size=2)
    one_error(pp_plan(microbatches=2, schedule="1F1B", virtual_stages=2), "parallel.pp.virtual_stages",
              "one stage per rank", world_size=2)
    d = pp_plan(microbatches=2, schedule="ZBVZeroBubble", virtual_stages=4)
    d["model"] = {"n_layers": 8}
    one_error(d, "parallel.pp.virtual_stages", "exactly 2 stages per rank", world_size=2)


def test_interleaved_microbatch_rounds():
    # 6 microbatches over 4 pp ranks: rounds = 1 -> fine; 10 over 4: rounds 2 -> fine; 9 over 4: rounds 2 -> bad
    d = {"parallel": {"pp_degree": 4, "dp_shard_degree": 1,
                      "pp": {"schedule": "Interleaved1F1B", "virtual_stages": 2, "microbatches": 9}},
         "model": {"n_layers": 8}, "data": {"micro_batch_size": 9, "global_batch_size": 9}}
    one_error(d, "parallel.pp.microbatches", "multiple of microbatches // pp_degree = 2", world_size=4)


def test_micro_batch_not_divisible_by_microbatches():
    one_error(pp_plan(microbatches=3), "data.micro_batch_size", "not divisible by parallel.pp.microbatches=3",
              world_size=2)


def test_tied_embeddings_with_pipeline():
    d = pp_plan(microbatches=2)
    d["model"] = {"tie_embeddings": True}
    one_error(d, "model.tie_embeddings", "pipeline stage", world_size=2)


# --- model, data, training --------------------------------------------------------------------------------

def test_model_shape_rules():
    one_error({"model": {"dim": 100, "n_heads": 8}}, "model.dim", "not divisible by model.n_heads=8")
    one_error({"model": {"dim": 96, "n_heads": 32}}, "model.dim", "must be even for rotary")
    one_error({"model": {"n_heads": 4, "n_kv_heads": 3}}, "model.n_kv_heads", "not divisible by n_kv_heads=3")
    one_error({"model": {"vocab_size": 100}}, "model.vocab_size", ">= 256")
    one_error({"model": {"n_layers": 0}}, "model.n_layers", ">= 1")


def test_global_batch_not_divisible():
    one_error({"data": {"global_batch_size": 10, "micro_batch_size": 2}}, "data.global_batch_size",
              "2 x 4 data-parallel ranks = 8", world_size=4)


def test_seq_len_beyond_model():
    one_error({"data": {"seq_len": 512}, "model": {"max_seq_len": 256}}, "data.seq_len",
              "exceeds model.max_seq_len=256")


def test_backend_device_mismatch():
    one_error({"training": {"device": "cpu", "backend": "hccl"}}, "training.backend", "device: npu")
    one_error({"training": {"device": "npu", "backend": "gloo"}}, "training.backend", "gloo cannot")
    assert load_plan({"training": {"device": "cpu"}}).training.resolved_backend == "gloo"


def test_optimizer_and_schedule_ranges():
    errs = errors_of({"optimizer": {"lr": -1, "betas": [0.9, 1.0], "eps": 0, "weight_decay": -0.1},
                      "schedule": {"warmup_steps": -1, "min_lr_ratio": 2}, "training": {"steps": 10,
                                                                                       "max_grad_norm": 0}})
    keys = [e.split(":")[0] for e in errs]
    assert keys == ["training.max_grad_norm", "optimizer.lr", "optimizer.betas[1]", "optimizer.eps",
                    "optimizer.weight_decay", "schedule.warmup_steps", "schedule.min_lr_ratio"]


def test_checkpoint_ranges():
    errs = errors_of({"checkpoint": {"enable_checkpoint": True, "folder": "", "interval": 0, "load_step": -2,
                                     "keep_latest_k": -1}})
    keys = [e.split(":")[0] for e in errs]
    assert keys == ["checkpoint.interval", "checkpoint.load_step", "checkpoint.keep_latest_k",
                    "checkpoint.folder"], errs
    one_error({"checkpoint": {"intervall": 5}}, "checkpoint.intervall", "interval")


# --- all at once ------------------------------------------------------------------------------------------

def test_all_errors_reported_at_once():
    data = {"modle": {}, "model": {"n_heads": 6, "dim": 96}, "parallel": {"tp_degree": 4, "pp_degree": 2,
            "pp": {"microbatches": 1}}, "data": {"seq_len": "long"}}
    errs = errors_of(data, world_size=8)
    keys = {e.split(":")[0] for e in errs}
    assert {"modle", "data.seq_len", "model.n_heads", "parallel.pp.microbatches"} <= keys, errs


def test_broken_field_does_not_cascade():
    # dim is garbage: rules that read dim (dim % n_heads) must stay quiet rather than judge the default
    errs = errors_of({"model": {"dim": "x", "n_heads": 7}})
    assert errs == ["model.dim: expected an integer, got 'x'"]


def test_warmup_longer_than_run_is_allowed():
    assert load_plan({"schedule": {"warmup_steps": 10}, "training": {"steps": 3}}).training.steps == 3


def test_data_path_must_exist(tmp_path):
    one_error({"data": {"path": str(tmp_path / "missing.txt")}}, "data.path", "not a readable file")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello")
    assert load_plan({"data": {"path": str(corpus)}}).data.path == str(corpus)


def test_validation_reads_the_plan_and_load_plan_resolves_it():
    import copy

    from npudist.plan import Plan, validate_plan
    from npudist.plan.convert import convert_dataclass
    data = {"parallel": {"pp_degree": 2, "pp": {"split_points": ["layers.1"]}},
            "data": {"micro_batch_size": 4, "global_batch_size": 8}}
    plan = convert_dataclass(copy.deepcopy(data), Plan, "", [])
    before = copy.deepcopy(plan)
    assert validate_plan(plan, world_size=4) == []
    assert plan == before                                  # dp_shard_degree -1 and "layers.1" untouched
    loaded = load_plan(data, world_size=4)
    assert loaded.parallel.dp_shard_degree == 2 and loaded.parallel.pp.split_points == [1]
