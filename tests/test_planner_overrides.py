"""The override language, provenance (explain), and the errors of bad specs and overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.errors import OverrideError, SpecError
from planner.loader import NodeKind, load_spec

MODELS = Path(__file__).resolve().parent.parent / "configs" / "models"
SPEECH = MODELS / "qwen3-omni-30b-a3b-speech.yaml"


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts in these tests come from real meta builds, never from planner.diskcache."""
    monkeypatch.setenv("OMNI_PLAN_CACHE", "off")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_cli_overrides_nested_fields_in_both_spellings() -> None:
    loaded = load_spec(
        SPEECH,
        ["--thinker.engine.max_running_requests", "8", "--talker.dtype=fp8", "code2wav.tp_size=1"],
    )
    assert loaded.spec.stages["thinker"].engine.max_running_requests == 8
    assert loaded.spec.stages["talker"].dtype == "fp8"


def test_precedence_spec_then_file_then_cli_and_explain(tmp_path: Path) -> None:
    ov = write(
        tmp_path / "ov.yaml",
        "stages:\n  thinker:\n    engine:\n      max_running_requests: 4\n"
        "stages.talker.engine.context_length: 2048\n",
    )
    loaded = load_spec(SPEECH, ["--thinker.engine.max_running_requests", "8"], ov)
    assert loaded.spec.stages["thinker"].engine.max_running_requests == 8
    assert loaded.spec.stages["talker"].engine.context_length == 2048
    text = loaded.provenance.explain("thinker.engine.max_running_requests")
    assert text.splitlines() == [
        "stages.thinker.engine.max_running_requests = 8",
        "  set by   command line --thinker.engine.max_running_requests 8",
        f"  overrode 4 from override file {ov}",
        f"  overrode 16 from spec {SPEECH}",
    ]
    # A value nobody set comes from the schema default.
    default = loaded.provenance.get("stages.thinker.batching.window_ms")
    assert (default.origin.source, default.value) == ("default", 2.0)
    assert "schema default" in loaded.provenance.explain("stages.thinker.batching.window_ms")
    spec_value = loaded.provenance.get("stages.talker.gpus")
    assert (spec_value.origin.source, spec_value.value) == ("spec", [1])


def test_same_path_twice_at_one_level_is_refused_unless_equal(tmp_path: Path) -> None:
    with pytest.raises(OverrideError, match=r"given twice at one level.*8 .*4 "):
        load_spec(SPEECH, ["--thinker.tp_size", "8", "--thinker.tp_size", "4"])
    load_spec(SPEECH, ["--thinker.dtype", "fp8", "--thinker.dtype=fp8"])  # same value: fine
    nested_and_dotted = write(
        tmp_path / "ov.yaml",
        "stages.thinker.engine.max_running_requests: 4\n"
        "stages:\n  thinker:\n    engine: {max_running_requests: 2}\n",
    )
    with pytest.raises(OverrideError, match="given twice with different values"):
        load_spec(SPEECH, override_file=nested_and_dotted)
    duplicate_key = write(
        tmp_path / "dup.yaml", "stages:\n  thinker: {tp_size: 2}\n  thinker: {}\n"
    )
    with pytest.raises(SpecError, match="key 'thinker' appears twice"):
        load_spec(SPEECH, override_file=duplicate_key)


def test_different_levels_may_disagree(tmp_path: Path) -> None:
    ov = write(tmp_path / "ov.yaml", "stages.thinker.tp_size: 2\n")
    assert load_spec(SPEECH, ["--thinker.tp_size", "1"], ov).spec.stages["thinker"].tp_size == 1


def test_unknown_stage_lists_stages_and_suggests() -> None:
    with pytest.raises(OverrideError) as exc:
        load_spec(SPEECH, ["--thinkr.tp_size", "2"])
    msg = str(exc.value)
    assert "unknown stage 'thinkr'" in msg
    assert "audio_encoder, code2wav, decode, image_encoder, preprocessing, talker, thinker" in msg
    assert "did you mean 'thinker'?" in msg


def test_unknown_field_lists_fields_and_suggests() -> None:
    with pytest.raises(OverrideError) as exc:
        load_spec(SPEECH, ["--thinker.engine.max_running", "2"])
    msg = str(exc.value)
    assert "unknown field 'max_running' in stages.thinker.engine" in msg
    assert "context_length" in msg and "did you mean 'max_running_requests'?" in msg
    with pytest.raises(OverrideError, match=r"unknown field 'tp' in stages.talker.*'tp_size'"):
        load_spec(SPEECH, ["--talker.tp", "2"])


@pytest.mark.parametrize(
    "field", ["next", "stream_to", "wait_for", "terminal", "executor", "process"]
)
def test_overrides_never_change_the_graph(field: str) -> None:
    with pytest.raises(OverrideError, match=f"'{field}' is part of the stage graph"):
        load_spec(SPEECH, [f"--talker.{field}", "[]"])


def test_group_and_leaf_misuse_and_missing_values() -> None:
    with pytest.raises(OverrideError, match=r"stages\.thinker\.engine is a group"):
        load_spec(SPEECH, ["--thinker.engine", "8"])
    with pytest.raises(OverrideError, match="missing value"):
        load_spec(SPEECH, ["--thinker.tp_size"])
    with pytest.raises(OverrideError, match="not an override path"):
        load_spec(SPEECH, ["--verbose", "1"])


def test_bad_values_name_the_path_and_where_they_came_from() -> None:
    with pytest.raises(SpecError) as exc:
        load_spec(SPEECH, ["--thinker.engine.max_running_requests", "lots"])
    msg = str(exc.value)
    assert "stages.thinker.engine.max_running_requests" in msg
    assert "from command line --thinker.engine.max_running_requests lots" in msg
    with pytest.raises(SpecError, match=r"stages.thinker.dtype: Input should be 'bf16'"):
        load_spec(SPEECH, ["--thinker.dtype", "int3"])
    with pytest.raises(SpecError, match="pins 1 GPUs"):
        load_spec(SPEECH, ["--thinker.tp_size", "2"])


def _spec(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load(SPEECH.read_text())
    raw["model_dir"] = str((SPEECH.parent / raw["model_dir"]).resolve())
    mutate(raw)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_bad_specs_give_precise_errors(tmp_path: Path) -> None:
    def unknown_edge(raw):
        raw["stages"]["talker"]["stream_to"] = ["code2wave"]

    with pytest.raises(SpecError, match=r"stages.talker.stream_to: unknown stage 'code2wave'"):
        load_spec(_spec(tmp_path, unknown_edge))

    def no_terminal(raw):
        for s in raw["stages"].values():
            s.pop("terminal", None)

    with pytest.raises(SpecError, match="no stage is terminal"):
        load_spec(_spec(tmp_path, no_terminal))

    def extra_field(raw):
        raw["stages"]["thinker"]["max_batch"] = 3

    with pytest.raises(
        SpecError, match=r"stages.thinker.max_batch: Extra inputs are not permitted"
    ):
        load_spec(_spec(tmp_path, extra_field))

    def no_component(raw):
        del raw["stages"]["talker"]["component"]

    with pytest.raises(SpecError, match="autoregressive stage needs a component"):
        load_spec(_spec(tmp_path, no_component))

    def mixed_tp(raw):
        raw["stages"]["code2wav"]["process"] = "thinker"
        raw["stages"]["thinker"].update(tp_size=2, gpus=[0, 1])

    with pytest.raises(SpecError, match="process 'thinker' mixes tp_size"):
        load_spec(_spec(tmp_path, mixed_tp))

    def two_sglang_engines(raw):
        raw["stages"]["talker"]["process"] = "thinker"

    with pytest.raises(
        SpecError,
        match=r"process 'thinker' holds 2 autoregressive stages \(thinker, talker\): SGLang "
        r"runs one engine per process; give each its own `process`",
    ):
        load_spec(_spec(tmp_path, two_sglang_engines))

    def torch_engine(raw):
        raw["stages"]["thinker"]["engine"]["backend"] = "transformers"

    with pytest.raises(SpecError, match=r"engine.backend: SGLang is the one engine"):
        load_spec(_spec(tmp_path, torch_engine))

    def legacy_backend(raw):  # (what every shipped spec said): still read
        raw["stages"]["thinker"]["engine"]["backend"] = "sglang"

    thinker = load_spec(_spec(tmp_path, legacy_backend)).spec.stages["thinker"]
    assert "backend" not in thinker.engine.model_dump()

    with pytest.raises(SpecError, match="no such spec file or model directory"):
        load_spec(tmp_path / "missing.yaml")


def test_bare_model_directory_is_one_autoregressive_stage() -> None:
    model_dir = MODELS.parent / "hf" / "Qwen--Qwen3-8B"
    loaded = load_spec(model_dir, ["--llm.engine.max_running_requests", "4"])
    ((name, stage),) = loaded.spec.stages.items()
    assert (name, stage.executor, stage.terminal) == ("llm", "autoregressive", True)
    assert stage.engine.max_running_requests == 4
    assert loaded.provenance.get("stages.llm.dtype").origin.source == "model-dir"


def test_pins_are_all_or_nothing() -> None:
    with pytest.raises(SpecError, match="some GPU stages pin gpus and talker do not"):
        load_spec(SPEECH, ["--talker.gpus", "null"])


@pytest.mark.parametrize(
    "spec",
    ["qwen3-omni-30b-a3b-speech.yaml", "qwen3-tts-12hz-0.6b.yaml", "qwen3-asr-0.6b-aligned.yaml"],
)
def test_gpus_cpu_runs_every_stage_in_fp32_unless_a_stage_says_otherwise(spec: str) -> None:
    """``--gpus cpu`` used to keep the spec's bf16 (a GPU's choice): on a CPU every stage
    diverged from the fp32 references. Now each stage runs fp32, the plan and the start-up log
    say so, and a per-stage override still wins."""
    from planner.api import plan_spec

    path = MODELS / spec
    gpu = plan_spec(path, "1xH200-141GB")
    assert any(s.dtype.value == "bf16" for s in gpu.spec.stages.values())  # the GPU default
    cpu = plan_spec(path, "cpu")
    assert {s.dtype.value for s in cpu.spec.stages.values()} == {"fp32"}
    placed = {p.stage: p.dtype for proc in cpu.plan.nodes[0].processes for p in proc.stages}
    assert placed == dict.fromkeys(cpu.spec.stages, "fp32")
    first = next(iter(cpu.spec.stages))
    mixed = plan_spec(path, "cpu", overrides=[f"--{first}.dtype", "bf16"])
    assert mixed.spec.stages[first].dtype.value == "bf16"
    assert mixed.provenance.entries[f"stages.{first}.dtype"].origin.source == "cli"


def test_a_cpu_stage_without_a_dtype_runs_fp32(tmp_path: Path) -> None:
    raw = yaml.safe_load((MODELS / "qwen3-tts-12hz-1.7b.yaml").read_text())
    del raw["stages"]["preprocessing"]["dtype"]  # device: cpu
    raw["model_dir"] = str((MODELS / raw["model_dir"]).resolve())
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw))
    loaded = load_spec(spec)
    assert loaded.spec.stages["preprocessing"].dtype.value == "fp32"
    assert loaded.spec.stages["tts_engine"].dtype.value == "auto"  # resolved by the node
    on_gpu = load_spec(spec, node=NodeKind(True, "a node with GPUs (1xH100-80GB)"))
    assert on_gpu.spec.stages["tts_engine"].dtype.value == "bf16"
    entry = on_gpu.provenance.entries["stages.tts_engine.dtype"]
    assert entry.origin.describe() == "auto, resolved for a node with GPUs (1xH100-80GB)"
    assert [o.value for o in entry.overrode] == ["auto"]
    origin = loaded.provenance.entries["stages.preprocessing.dtype"].origin
    assert origin.describe() == "schema default for a cpu stage"
