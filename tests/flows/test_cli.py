"""Tests for the ``nextloc`` command line (:mod:`commands.main`), without running any preprocessing.

Error paths run the real command in a subprocess and check that it stops before any work: exit code 2,
a message naming the bad key, no output folder, no Prefect state folder and no Prefect import. The
config-plumbing tests call :func:`commands.main.main` in-process with the preprocess flow replaced by a stub.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commands import main as cli
from nextloc.config import PreprocessConfig, flatten

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("preprocess", "run", "download")


def nextloc(*args: str, prefect_home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m commands.main ARGS`` from the repository root."""
    env = {**os.environ, "COLUMNS": "250", "PREFECT_HOME": str(prefect_home), "NO_COLOR": "1"}
    env.pop("NEXTLOC_GEOLIFE_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "commands.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def one_line(text: str) -> str:
    """Rich wraps log messages; join the lines so that a message can be searched for as a whole."""
    return " ".join(text.split())


@pytest.fixture
def dirs(tmp_path: Path) -> types.SimpleNamespace:
    raw = tmp_path / "raw"
    (raw / "Data").mkdir(parents=True)
    return types.SimpleNamespace(raw=raw, out=tmp_path / "out", prefect=tmp_path / "prefect-home")


def assert_stopped_before_work(result: subprocess.CompletedProcess[str], dirs: types.SimpleNamespace) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    assert not dirs.out.exists(), "the output folder was created"
    assert not dirs.prefect.exists(), "Prefect was started"
    return one_line(output)


# ------------------------------------------------------------------------------------------------- help


class TestHelp:
    def test_top_level_help_lists_commands(self, tmp_path: Path) -> None:
        result = nextloc("--help", prefect_home=tmp_path / "p")
        assert result.returncode == 0, result.stderr
        for command in COMMANDS:
            assert command in result.stdout
        assert not (tmp_path / "p").exists()

    def test_no_command_is_a_usage_error(self, tmp_path: Path) -> None:
        result = nextloc(prefect_home=tmp_path / "p")
        assert result.returncode == 2
        assert "usage: nextloc" in result.stderr

    def test_unknown_command(self, tmp_path: Path) -> None:
        result = nextloc("preprocesss", prefect_home=tmp_path / "p")
        assert result.returncode == 2
        assert "invalid choice" in result.stderr

    @pytest.mark.parametrize("command", ["preprocess", "run"])
    def test_every_config_key_is_an_option(self, command: str, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as info:
            cli.main([command, "--help"])
        assert info.value.code == 0
        text = capsys.readouterr().out
        for option in (
            "--raw-dir",
            "--data-dir",
            "--config",
            "--set",
            "--locations.epsilon_m",
            "--split.train",
        ):
            assert option in text
        for key, default in flatten(PreprocessConfig()).items():
            assert f"--{key}" in text, key
            assert f"(default {default})" in one_line(text), key

    def test_preprocess_help_in_subprocess(self, tmp_path: Path) -> None:
        result = nextloc("preprocess", "--help", prefect_home=tmp_path / "p")
        assert result.returncode == 0, result.stderr
        assert "--locations.epsilon_m" in result.stdout
        assert "--staypoints.dist_threshold_m" in result.stdout
        assert "--raw-dir" in result.stdout

    @pytest.mark.parametrize("command", ["run", "train"])
    def test_model_help_names_exactly_the_registered_kinds(
        self, command: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The --model help is the kind registry's: each kind with its description (no torch imported)."""
        import re

        from nextloc.models.registry import KINDS

        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = one_line(capsys.readouterr().out)
        listed = re.search(r"--model MODEL comma list of: (.*?) --seeds", text)
        assert listed, text
        named = set(re.findall(r"(?:^|; )([a-z_]+):", listed.group(1)))
        assert named == set(KINDS)

    def test_download_help(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as info:
            cli.main(["download", "--help"])
        assert info.value.code == 0
        text = capsys.readouterr().out
        for option in ("--dest", "--url", "--sha256"):
            assert option in text


# ------------------------------------------------------------------------------------ bad configuration

BAD_CONFIG = [
    pytest.param(["--locations.epsilon_m", "-5"], "locations.epsilon_m", id="negative-epsilon"),
    pytest.param(["--locations.epsilon_m", "0"], "locations.epsilon_m", id="zero-epsilon"),
    pytest.param(["--locations.epsilon_m", "twenty"], "locations.epsilon_m", id="text-epsilon"),
    pytest.param(["--locations.epsilon_m", "true"], "locations.epsilon_m", id="bool-epsilon"),
    pytest.param(["--locations.epsilon_m", "Infinity"], "locations.epsilon_m", id="inf-epsilon"),
    pytest.param(["--locations.min_samples", "2.5"], "locations.min_samples", id="float-min-samples"),
    pytest.param(["--set", "nope=1"], "nope", id="set-unknown-top"),
    pytest.param(["--set", "locations.nope=3"], "locations.nope", id="set-unknown-nested"),
    pytest.param(["--set", "locations.epsilon_m=-5"], "locations.epsilon_m", id="set-negative"),
    pytest.param(["--set", "novalue"], "KEY=VALUE", id="set-without-equals"),
    pytest.param(["--split.train", "0.9"], "split", id="split-sum"),
    pytest.param(["--timezone", "Mars/Olympus_Mons"], "timezone", id="timezone"),
    pytest.param(["--locations.coordinate_order", "xy"], "locations.coordinate_order", id="literal"),
    pytest.param(["--protocol", "live"], "protocol", id="protocol"),
    pytest.param(["--staypoints.include_last", "maybe"], "staypoints.include_last", id="bool"),
]


class TestBadConfig:
    @pytest.mark.parametrize(("args", "key"), BAD_CONFIG)
    def test_preprocess_rejects_before_work(
        self, dirs: types.SimpleNamespace, args: list[str], key: str
    ) -> None:
        result = nextloc(
            "preprocess",
            "--raw-dir",
            str(dirs.raw),
            "--data-dir",
            str(dirs.out),
            *args,
            prefect_home=dirs.prefect,
        )
        output = assert_stopped_before_work(result, dirs)
        assert key in output

    def test_split_message_says_why(self, dirs: types.SimpleNamespace) -> None:
        result = nextloc(
            "preprocess",
            "--raw-dir",
            str(dirs.raw),
            "--data-dir",
            str(dirs.out),
            "--split.train",
            "0.9",
            prefect_home=dirs.prefect,
        )
        assert "must sum to 1" in assert_stopped_before_work(result, dirs)

    @pytest.mark.parametrize(
        ("args", "key"),
        [
            pytest.param(["--locations.epsilon_m", "-5"], "locations.epsilon_m", id="negative-epsilon"),
            pytest.param(["--set", "nope=1"], "nope", id="set-unknown"),
            pytest.param(["--split.train", "0.9"], "split", id="split-sum"),
        ],
    )
    def test_run_rejects_before_work(self, dirs: types.SimpleNamespace, args: list[str], key: str) -> None:
        # --raw-dir is given so that a config check that failed to stop it could not go looking for data.
        result = nextloc(
            "run", "--raw-dir", str(dirs.raw), "--data-dir", str(dirs.out), *args, prefect_home=dirs.prefect
        )
        assert key in assert_stopped_before_work(result, dirs)

    @pytest.mark.parametrize(
        ("args", "key"),
        [
            pytest.param(["--train-set", "bogus=1"], "bogus", id="unknown-training-option"),
            pytest.param(["--train-set", "dropout_rng=mt"], "dropout_rng", id="bad-training-value"),
            pytest.param(["--train-set", "bucket_pool=0"], "bucket_pool", id="bad-pool"),
            pytest.param(["--model-set", "d_modle=64"], "d_modle", id="unknown-model-key"),
        ],
    )
    @pytest.mark.parametrize("command", ["run", "train"])
    def test_training_overrides_are_checked_before_work(
        self, dirs: types.SimpleNamespace, command: str, args: list[str], key: str
    ) -> None:
        """What a training would reject minutes later (after the preprocessing, for run) stops the command
        at once, naming the model kind and the key."""
        where = ["--raw-dir", str(dirs.raw)] if command == "run" else []
        result = nextloc(
            command, *where, "--data-dir", str(dirs.out), "--model", "mhsa", *args, prefect_home=dirs.prefect
        )
        message = assert_stopped_before_work(result, dirs)
        assert key in message
        assert "ERROR mhsa: " in message

    def test_train_without_preprocessed_data_stops_before_work(self, dirs: types.SimpleNamespace) -> None:
        """``nextloc train`` on a folder that was never preprocessed says so before Prefect starts."""
        dirs.out.mkdir()
        result = nextloc("train", "--data-dir", str(dirs.out), "--model", "mhsa", prefect_home=dirs.prefect)
        output = one_line(result.stdout + result.stderr)
        assert result.returncode == 2, output
        assert "Traceback" not in output
        assert "preprocessed data missing under" in output
        assert "metadata.json" in output
        assert "run `nextloc preprocess` first" in output
        assert not dirs.prefect.exists(), "Prefect was started"
        assert list(dirs.out.iterdir()) == []

    @pytest.mark.parametrize(
        ("yaml_text", "key"),
        [
            ("preprocess:\n  locations:\n    epsilonm: 50\n", "locations.epsilonm"),
            ("preprocess:\n  quality:\n    day_filter: lots\n", "quality.day_filter"),
            ("preprocess: [\n", "not valid YAML"),
            ("- 1\n", "expected a mapping"),
        ],
    )
    def test_bad_config_file(
        self, dirs: types.SimpleNamespace, tmp_path: Path, yaml_text: str, key: str
    ) -> None:
        config = tmp_path / "bad.yaml"
        config.write_text(yaml_text)
        result = nextloc(
            "preprocess",
            "--raw-dir",
            str(dirs.raw),
            "--data-dir",
            str(dirs.out),
            "--config",
            str(config),
            prefect_home=dirs.prefect,
        )
        assert key in assert_stopped_before_work(result, dirs)

    def test_missing_config_file(self, dirs: types.SimpleNamespace, tmp_path: Path) -> None:
        missing = tmp_path / "nope.yaml"
        result = nextloc(
            "preprocess",
            "--raw-dir",
            str(dirs.raw),
            "--data-dir",
            str(dirs.out),
            "--config",
            str(missing),
            prefect_home=dirs.prefect,
        )
        assert "nope.yaml" in assert_stopped_before_work(result, dirs)

    def test_nothing_heavy_is_imported(self, dirs: types.SimpleNamespace) -> None:
        """The config is checked before the flow (and so Prefect) is even imported."""
        code = (
            "import json, sys\n"
            "from commands.main import main\n"
            f"rc = main(['preprocess', '--raw-dir', {str(dirs.raw)!r}, '--data-dir', {str(dirs.out)!r},"
            " '--set', 'nope=1'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('prefect', 'mlflow', 'torch')"
            " or m == 'flows.preprocess')\n"
            "print(json.dumps({'rc': rc, 'heavy': heavy}))\n"
        )
        env = {**os.environ, "PREFECT_HOME": str(dirs.prefect), "COLUMNS": "250"}
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report == {"rc": 2, "heavy": []}
        assert not dirs.out.exists()


class TestRawDir:
    def test_missing_raw_dir_path(self, dirs: types.SimpleNamespace, tmp_path: Path) -> None:
        missing = tmp_path / "no-such-geolife"
        result = nextloc(
            "preprocess", "--raw-dir", str(missing), "--data-dir", str(dirs.out), prefect_home=dirs.prefect
        )
        output = assert_stopped_before_work(result, dirs)
        assert "--raw-dir" in output
        assert str(missing) in output
        assert "does not exist" in output

    def test_raw_dir_is_required(self, dirs: types.SimpleNamespace) -> None:
        result = nextloc("preprocess", "--data-dir", str(dirs.out), prefect_home=dirs.prefect)
        assert result.returncode == 2
        assert "--raw-dir" in result.stderr
        assert "required" in result.stderr
        assert not dirs.out.exists()

    def test_bad_config_is_reported_before_missing_raw_dir(
        self, dirs: types.SimpleNamespace, tmp_path: Path
    ) -> None:
        result = nextloc(
            "preprocess",
            "--raw-dir",
            str(tmp_path / "nope"),
            "--data-dir",
            str(dirs.out),
            "--set",
            "nope=1",
            prefect_home=dirs.prefect,
        )
        output = assert_stopped_before_work(result, dirs)
        assert "nope" in output
        assert "Extra inputs are not permitted" in output


class TestPredictCoverage:
    @pytest.mark.parametrize("value", ["0", "1", "1.0", "-0.2", "1.5", "nan", "inf", "often"])
    def test_a_coverage_outside_0_1_is_a_usage_error(
        self, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Refused while the arguments are parsed: before any model, store or Prefect API is touched."""
        with pytest.raises(SystemExit) as info:
            cli.main(["predict", "--history", str(tmp_path / "visits.json"), "--coverage", value])
        assert info.value.code == 2
        error = one_line(capsys.readouterr().err)
        assert (
            f"argument --coverage: coverage must be a number strictly between 0 and 1, got {value!r}" in error
        )

    def test_the_help_names_the_option(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit):
            cli.main(["predict", "--help"])
        assert "--coverage P" in capsys.readouterr().out


# ----------------------------------------------------------------------- config plumbing (flow stubbed)


class _FlowCalled(Exception):
    pass


@pytest.fixture
def stub_flow(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Replace ``flows.preprocess`` by a stub that records its arguments and stops the command."""
    calls: dict[str, Any] = {}

    def preprocess(raw_dir: str, data_dir: str, config: PreprocessConfig) -> dict[str, Any]:
        calls.update(raw_dir=raw_dir, data_dir=data_dir, config=config)
        raise _FlowCalled

    monkeypatch.setitem(sys.modules, "flows.preprocess", types.SimpleNamespace(preprocess=preprocess))
    # main() sets process-wide environment defaults and logger levels; keep them out of the other tests.
    environ = dict(os.environ)
    level = logging.getLogger("nextloc").level
    yield calls
    os.environ.clear()
    os.environ.update(environ)
    logging.getLogger("nextloc").setLevel(level)


class TestConfigPlumbing:
    def test_options_reach_the_flow(self, stub_flow: dict[str, Any], dirs: types.SimpleNamespace) -> None:
        with pytest.raises(_FlowCalled):
            cli.main(
                [
                    "preprocess",
                    "--raw-dir",
                    str(dirs.raw),
                    "--data-dir",
                    str(dirs.out),
                    "--locations.epsilon_m",
                    "50",
                    "--timezone",
                    "Asia/Shanghai",
                    "--locations.coordinate_order",
                    "lat_lon",
                    "--protocol",
                    "deployment",
                    "--staypoints.include_last",
                    "false",
                    "--set",
                    "samples.previous_days=14",
                    "--set",
                    "quality.day_filter=10",
                ]
            )
        config = stub_flow["config"]
        assert (stub_flow["raw_dir"], stub_flow["data_dir"]) == (str(dirs.raw), str(dirs.out))
        assert config.locations.epsilon_m == 50.0
        assert config.timezone == "Asia/Shanghai"
        assert config.locations.coordinate_order == "lat_lon"
        assert config.protocol == "deployment"
        assert config.staypoints.include_last is False
        assert config.samples.previous_days == 14
        assert config.quality.day_filter == 10
        assert config.split == PreprocessConfig().split

    def test_no_options_gives_reference_defaults(
        self, stub_flow: dict[str, Any], dirs: types.SimpleNamespace
    ) -> None:
        with pytest.raises(_FlowCalled):
            cli.main(["preprocess", "--raw-dir", str(dirs.raw), "--data-dir", str(dirs.out)])
        assert stub_flow["config"] == PreprocessConfig()

    def test_precedence_yaml_then_set_then_option(
        self, stub_flow: dict[str, Any], dirs: types.SimpleNamespace, tmp_path: Path
    ) -> None:
        config_file = tmp_path / "c.yaml"
        config_file.write_text(
            "preprocess:\n  locations:\n    epsilon_m: 30\n    min_samples: 5\n  quality:\n    day_filter: 7\n"
        )
        with pytest.raises(_FlowCalled):
            cli.main(
                [
                    "preprocess",
                    "--raw-dir",
                    str(dirs.raw),
                    "--data-dir",
                    str(dirs.out),
                    "--config",
                    str(config_file),
                    "--set",
                    "locations.epsilon_m=40",
                    "--set",
                    "locations.min_samples=3",
                    "--locations.epsilon_m",
                    "60",
                ]
            )
        config = stub_flow["config"]
        assert config.locations.epsilon_m == 60.0  # option beats --set beats YAML
        assert config.locations.min_samples == 3  # --set beats YAML
        assert config.quality.day_filter == 7  # YAML beats defaults

    def test_set_text_value(self, stub_flow: dict[str, Any], dirs: types.SimpleNamespace) -> None:
        with pytest.raises(_FlowCalled):
            cli.main(["preprocess", "--raw-dir", str(dirs.raw), "--set", "timezone=Etc/GMT-8"])
        assert stub_flow["config"].timezone == "Etc/GMT-8"

    def test_bad_value_returns_2_without_calling_the_flow(
        self, stub_flow: dict[str, Any], dirs: types.SimpleNamespace
    ) -> None:
        rc = cli.main(["preprocess", "--raw-dir", str(dirs.raw), "--locations.epsilon_m", "-5"])
        assert rc == 2
        assert stub_flow == {}
