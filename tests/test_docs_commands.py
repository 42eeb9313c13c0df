"""Every shell command of the docs runs, or says why it cannot run here.

The shell blocks (```bash, ```sh, ```shell, ```console) of README.md and docs/*.md are read command by command
(continuation lines joined, ``NAME=value`` lines kept as the variables of the later commands of the block, ``for``
loops unrolled) and each is checked as cheaply as it can be and still fail when the doc is wrong:

* ``python run.py ...`` (also behind ``torchrun``, ``srun``, ``nohup``, ``tmux new``, ``sbatch --wrap``): every job of
  the command (a grid's sweeps expanded, a ``+sweep`` config's too) is composed from conf/ as run.py composes it and
  checked as a run is before it trains (``swalab.train.plan.validate``: no data, nothing written); with ``--help`` or
  ``--cfg`` the command itself runs;
* ``python -m swalab.results.row ...`` runs with ``--dry-run`` and each run.py command it prints is checked as above;
* any other ``python -m swalab...`` parses its arguments with the tool's own parser (``--help`` runs);
* ``make <target>`` runs as ``make -n <target>``.

A command none of these covers must be listed in :data:`NOT_RUN_HERE` with why (a GPU, a SLURM cluster, the
internet, hours), or sit in a block another test runs as written (:data:`BLOCKS_RUN_ELSEWHERE`): a command that is
neither checked nor listed fails, so a new doc cannot slip past.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import io
import itertools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import CONF_DIR, REPO
from swalab.config import check_overrides
from swalab.identity import IDENTITY_FILE, record
from swalab.rundir import write_json
from swalab.train.plan import prepare, validate

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = ("bash", "sh", "shell", "console")

# Blocks that another test runs as written, found by the marker line above their fence.
BLOCKS_RUN_ELSEWHERE = {
    "<!-- example: bring-your-own -->": "tests/test_readme_example.py runs this block as written",
}

# What a placeholder of the docs stands for when its command is checked here.
PLACEHOLDERS = {
    "<cifar10 dir>": "data/cifar10",
    "<date_time>": "2026-01-01_00-00-00",
    "<swa run>": "swa-run",
    "<fge run>": "fge-run",
}

# The commands that cannot run here, as the docs write them (the comment after `#` left out), each with why.
IN_A_SLURM_JOB = "the requeue step of an sbatch script: runs inside a SLURM job (the cluster tests try it)"
NOT_RUN_HERE = {
    "source .venv/bin/activate": "activates the virtual environment that these tests already run in",
    "pip install -e .[slurm]": "installs from the package index: needs the internet (the SLURM commands on the page "
                               "are composed here with the installed plugin)",
    "tests/cluster/slurm-up": "starts a local SLURM cluster, as root (the `cluster` tests start it when they can)",
    "tests/cluster/slurm-down": "stops that cluster",
    "python -m pytest -m cluster tests/test_cluster.py tests/test_cluster_requeue.py tests/test_cluster_tasks.py":
        "the cluster tests: about 7 minutes on the cluster of tests/cluster/slurm-up (skipped with their reason "
        "without it)",
    'if [ $code -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi': IN_A_SLURM_JOB,
    "exit $code": IN_A_SLURM_JOB,
    "torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=<host>:29400 --rdzv_id=<id> run.py ...":
        "two nodes, and its run.py arguments are elided (`...`); the one-node torchrun line above is checked",
    "OMP_NUM_THREADS=1 WANDB_MODE=disabled nice -n 10 .venv/bin/mutmut run --max-children 1":
        "mutation testing: hours (`make mutate`)",
    "OMP_NUM_THREADS=1 WANDB_MODE=disabled .venv/bin/mutmut run --max-children 2": "mutation testing: hours",
}

RUN_PY_QUERIES = ("--help", "-h", "--cfg", "--info", "-c")  # run.py flags that print and exit: run as they are


@dataclass
class DocCommand:
    """One command of a doc's shell block: as written (``text``, its comment left out) and as a shell would run
    it (``words``: the block's variables expanded, placeholders filled in)."""

    doc: str
    text: str
    words: list[str]
    block: int
    elsewhere: str | None = None
    variables: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.doc}: {self.text}"


# -- reading the docs ---------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=")
FOR_LOOP = re.compile(r"^for (\w+) in ([^;]+); do (.+); done$")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")


def without_comment(line: str) -> str:
    """``line`` up to its first ``#`` that starts a shell comment (outside quotes, at the start of a word)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def logical_lines(body: str, console: bool) -> list[str]:
    """The block's commands: continuation lines joined, heredoc bodies and comment lines left out, ``$ `` prompts of a
    console block taken and its output lines dropped."""
    lines = body.splitlines()
    if console:
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    out, current, heredoc_end = [], "", None
    for line in lines:
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1].rstrip() + " "
            continue
        text = " ".join(without_comment(current).split())
        current = ""
        if text:
            out.append(text)
            if match := HEREDOC.search(text):
                heredoc_end = match.group(1)
    return out


def expand(text: str, variables: dict[str, str]) -> str:
    """``text`` with ``$NAME`` / ``${NAME}`` of the block's variables replaced and the placeholders filled in."""
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"\$(?:{name}\b|\{{{name}\}})", lambda _: value, text)
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    return text


def words_of(text: str) -> list[str]:
    """``text`` split as a shell splits it; ``;``, ``&``, ``>`` and ``|`` come out as words of their own."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def assignments(text: str) -> dict[str, str] | None:
    """The variables a line sets when it only sets variables (``R=...``, ``S=a; G=b``, ``export X=y``), else None."""
    words = [w for w in words_of(text) if w not in (";", "export")]
    if not words or not all(ASSIGNMENT.match(w) for w in words):
        return None
    return dict(w.split("=", 1) for w in words)


def doc_commands() -> list[DocCommand]:
    """Every command of every shell block of the docs, in order."""
    commands = []
    for path in DOCS:
        text = path.read_text()
        for number, match in enumerate(m for m in FENCE.finditer(text) if m.group(1) in SHELL_FENCES):
            before = text[:match.start()].rstrip().rsplit("\n", 1)[-1].strip()
            elsewhere = BLOCKS_RUN_ELSEWHERE.get(before)
            variables: dict[str, str] = {}
            for line in logical_lines(match.group(2), console=match.group(1) == "console"):
                found = assignments(line)
                if found is not None:
                    variables.update({k: expand(v, variables) for k, v in found.items()})
                    continue
                loop = FOR_LOOP.match(line)
                bodies = ([expand(loop.group(3), {**variables, loop.group(1): value})
                           for value in loop.group(2).split()] if loop else [expand(line, variables)])
                commands += [DocCommand(str(path.relative_to(REPO)), line, words_of(body), number, elsewhere,
                                        dict(variables)) for body in bodies]
    return commands


# -- what a command runs ------------------------------------------------------------------------------------------

def unwrapped(words: list[str]) -> list[str]:
    """The command a line runs: leading ``NAME=value`` settings, ``nohup``/``srun``/``nice -n N``, a trailing
    ``> file 2>&1 &``, ``tmux new -s NAME 'command'``, ``sbatch ... --wrap "command"`` and ``torchrun ... run.py``
    taken off."""
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    if ">" in words:
        words = words[:words.index(">")]
    while words and words[-1] in ("&", ";"):
        words = words[:-1]
    if words[:1] in (["nohup"], ["srun"]):
        return unwrapped(words[1:])
    if words[:2] == ["nice", "-n"]:
        return unwrapped(words[3:])
    if words[:2] == ["tmux", "new"]:
        return unwrapped(words_of(words[-1]))
    if words[:1] == ["sbatch"] and "--wrap" in words:
        return unwrapped(words_of(words[words.index("--wrap") + 1]))
    if words[:1] == ["torchrun"] and "run.py" in words:
        return ["python", *words[words.index("run.py"):]]
    return words


def hydra_overrides(args: list[str]) -> tuple[bool, list[str]]:
    """(``-m`` given, the overrides) of run.py's arguments."""
    multirun = bool({"-m", "--multirun"} & set(args))
    return multirun, [a for a in args if a not in ("-m", "--multirun")]


def jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The overrides of each job the command starts: the command line's sweeps and its ``+sweep`` config's
    (``hydra.sweeper.params``; a sweep of the same key on the command line replaces the config's), expanded."""
    if not multirun:
        return [overrides]
    parser = OverridesParser.create()
    given = parser.parse_overrides(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        params = compose(config_name="config", overrides=[o.input_line for o in given if not o.is_sweep_override()],
                         return_hydra_config=True).hydra.sweeper.params
    keys = {o.key_or_group for o in given}
    swept = [o for o in parser.parse_overrides([f"{k}={v}" for k, v in (params or {}).items()])
             if o.key_or_group not in keys] + given
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in swept]
    return [list(combination) for combination in itertools.product(*choices)]


def is_hydras(override: str) -> bool:
    """Whether ``override`` sets Hydra's own config (``hydra/launcher=slurm``, ``hydra.launcher.partition=gpu``)."""
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


def check_run_py(args: list[str], tmp_path: Path) -> int:
    """Compose every job of ``python run.py <args>`` as run.py does and check it as a run is checked before it trains
    (the command's hydra settings composed too); returns the number of jobs."""
    multirun, overrides = hydra_overrides(args)
    flags = [a for a in overrides if a.startswith("-")]
    assert not flags, f"run.py flags this test does not know: {flags}"
    count = 0
    for job in jobs(overrides, multirun):  # the hydra settings (hydra/launcher=slurm, hydra.launcher.*) composed too
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            groups = list(compose(config_name="config", overrides=job, return_hydra_config=True).hydra.runtime.choices)
            cfg = compose(config_name="config", overrides=[o for o in job if not is_hydras(o)])
        check_overrides(job, groups)
        validate(cfg)
        count += 1
    return count


def run_py_itself(args: list[str], tmp_path: Path) -> str:
    """``python run.py <args>`` run as it is (from an empty folder: it writes nothing); returns what it printed."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
    assert not any(tmp_path.iterdir()), f"wrote {sorted(tmp_path.iterdir())}"
    return done.stdout


class Parsed(BaseException):
    """Raised by the tool's parser once it has read the arguments: the tool stops before it does anything."""


def parse_only(module: str, args: list[str]) -> argparse.Namespace:
    """``python -m <module> <args>`` up to the moment its arguments are parsed (argparse refuses bad ones, exit 2)."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        main_of(module)(args)
    except Parsed as parsed:
        return parsed.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"python -m {module} did not parse its arguments with argparse")


def tool_main(module: str, args: list[str]) -> tuple[object, str]:
    """``python -m <module> <args>`` in this process: (what main returned or the SystemExit code, its stdout)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            result = main_of(module)(args)
        except SystemExit as exc:
            result = exc.code
    return result, out.getvalue()


def first_seed_only(args: list[str]) -> list[str]:
    """A row's arguments with ``--seeds a b c`` cut to ``--seeds a``: every seed's jobs are the same but for the seed,
    and planning one reads the data set's files (its fingerprint) once instead of per seed."""
    if "--seeds" not in args:
        return args
    start = args.index("--seeds") + 1
    end = next((i for i in range(start, len(args)) if not args[i].isdigit()), len(args))
    return [*args[:start + 1], *args[end:]]


def main_of(module: str):
    """The ``main`` that ``python -m <module>`` calls (a package's is in its ``__main__``)."""
    loaded = importlib.import_module(module)
    return loaded.main if hasattr(loaded, "main") else importlib.import_module(f"{module}.__main__").main


def check_tool(words: list[str], tmp_path: Path) -> None:
    """A ``python -m swalab...`` command: ``--help`` run, ``swalab.results.row`` dry-run with each of its run.py
    commands checked, any other parsed by its own parser."""
    module, args = words[2], words[3:]
    if "--help" in args or "-h" in args:
        code, printed = tool_main(module, args)
        assert code in (0, None) and printed.strip(), f"`python -m {module} --help` exited {code}"
    elif module == "swalab.results.row":  # its dry run checks each job's config as run.py would (row.run_dir_of)
        result, printed = tool_main(module, [*first_seed_only(args), "--dry-run"])
        assert result == {}, f"`python -m swalab.results.row ... --dry-run` failed: {result}"
        assert sum("run.py" in line for line in printed.splitlines()) >= 2, printed
    else:
        parse_only(module, args)


def checker(command: DocCommand):
    """How ``command`` is checked here, or None."""
    words = unwrapped(command.words)
    if words[:2] == ["python", "run.py"]:
        args = words[2:]
        if any(a in RUN_PY_QUERIES for a in args):
            return lambda tmp_path: run_py_itself(args, tmp_path)
        return lambda tmp_path: check_run_py(args, tmp_path)
    if words[:2] == ["python", "-m"] and words[2:3] and words[2].split(".")[0] == "swalab":
        return lambda tmp_path: check_tool(words, tmp_path)
    if words[:1] == ["make"] and len(words) == 2:
        return lambda tmp_path: subprocess.run(["make", "-n", words[1]], cwd=REPO, check=True, capture_output=True)
    return None


COMMANDS = doc_commands()


# -- the tests ----------------------------------------------------------------------------------------------------

def run_or_skip(command: DocCommand, tmp_path: Path) -> None:
    """Check ``command``, skip it with the reason its list gives, or fail: it is neither checked nor listed."""
    if command.text in NOT_RUN_HERE:
        pytest.skip(NOT_RUN_HERE[command.text])
    if command.elsewhere:
        pytest.skip(command.elsewhere)
    check = checker(command)
    assert check is not None, (
        f"{command.doc}: `{command.text}` is neither checked by this test nor listed in NOT_RUN_HERE with why it "
        "cannot run here: give it a check (tests/test_docs_commands.py) or list it")
    check(tmp_path)


def written(text: str, doc: str = "docs/new.md") -> DocCommand:
    """A command as a new doc might write it."""
    return DocCommand(doc, text, words_of(text), 0)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_each_shell_command_of_the_docs_runs_here_or_is_listed_with_why_it_cannot(command, tmp_path):
    run_or_skip(command, tmp_path)


def test_the_docs_shell_blocks_are_read_and_most_of_their_commands_are_checked():
    checked = [c for c in COMMANDS if checker(c) and not c.elsewhere and c.text not in NOT_RUN_HERE]
    assert len(COMMANDS) > 50 and len(checked) > 40
    assert {c.doc for c in checked} >= {"README.md", "docs/cluster.md", "docs/posthoc.md", "docs/analysis.md"}


def test_every_command_listed_as_not_run_here_is_still_in_the_docs():
    written = {c.text for c in COMMANDS}
    assert not set(NOT_RUN_HERE) - written, "listed but no longer in the docs: drop them from NOT_RUN_HERE"
    texts = "".join(path.read_text() for path in DOCS)
    assert all(p in texts for p in PLACEHOLDERS), [p for p in PLACEHOLDERS if p not in texts]
    assert all(marker in texts for marker in BLOCKS_RUN_ELSEWHERE)


def test_no_doc_holds_a_command_in_an_indented_block_which_this_test_would_not_read():
    indented = re.compile(r"\n\n((?: {4})+(?:python|torchrun|srun|sbatch|make|OMP_NUM_THREADS=)\b[^\n]*)")
    found = [(str(path.relative_to(REPO)), m.group(1).strip()) for path in DOCS
             for m in indented.finditer(FENCE.sub("", path.read_text()))]
    assert not found, f"fence these as ```bash: {found}"


def test_a_command_the_test_cannot_check_and_no_list_names_fails_it(tmp_path):
    with pytest.raises(AssertionError, match="neither checked by this test nor listed in NOT_RUN_HERE"):
        run_or_skip(written("rsync -a outputs/ cluster:outputs/"), tmp_path)


def test_a_doc_command_with_a_key_a_flag_or_a_mode_that_does_not_exist_fails(tmp_path):
    with pytest.raises(Exception, match="lrr"):
        run_or_skip(written("python run.py -m method=sgd,swa model.swa.lrr=0.05"), tmp_path)
    with pytest.raises(SystemExit):
        run_or_skip(written("python -m swalab.results.report outputs --outt report"), tmp_path)
    with pytest.raises(AssertionError, match="Only one of --run, --multirun, --cfg"):  # what docs/cluster.md once said
        run_or_skip(written("python run.py -m hydra/launcher=slurm --cfg hydra -p hydra.launcher"), tmp_path)


def posthoc_example() -> list[DocCommand]:
    return [c for c in COMMANDS if c.doc == "docs/posthoc.md"
            and c.block == min(d.block for d in COMMANDS if d.doc == "docs/posthoc.md")]


def test_the_run_directories_the_posthoc_example_names_are_those_its_commands_train_into(tmp_path, monkeypatch):
    """The example spells its runs' directories out ($SGD, $SWA, the fine-tune's glob): they are where its run.py
    commands put their runs (the names come from the config: a renamed setting would leave the doc behind). Each run
    is planned with the runs before it recorded, as training them leaves them: the fine-tune's name holds the SGD run
    it starts from (model.init_from-run-<its group hash>) only once that run is there."""
    monkeypatch.chdir(tmp_path)  # the example's relative outputs/ lands here
    commands = posthoc_example()
    made = []
    for command in (c for c in commands if unwrapped(c.words)[:2] == ["python", "run.py"]):
        overrides = unwrapped(command.words)[2:]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            choices = dict(compose(config_name="config", overrides=overrides,
                                   return_hydra_config=True).hydra.runtime.choices)
            cfg = compose(config_name="config", overrides=overrides)
            plan = prepare(cfg, overrides=overrides, choices=choices)
        made.append(str(plan.run_dir))
        plan.run_dir.mkdir(parents=True)  # the identity a trained run records, which a run started from it reads
        write_json(plan.run_dir / IDENTITY_FILE, record(plan.identity, plan.settings))
    named = [w.split("@")[0] for c in commands if unwrapped(c.words)[:3] == ["python", "-m", "swalab.posthoc"]
             for w in unwrapped(c.words)[3:] if w.startswith(c.variables["R"])]
    named += [v for c in commands for k, v in c.variables.items() if k in ("SGD", "SWA")]
    assert len(made) == 6 and len(named) >= 8
    for path in named:
        assert any(fnmatch.fnmatch(run, path) or run.startswith(path.rstrip("/") + "/") for run in made), \
            f"docs/posthoc.md names {path}, which no command of the example trains into: {made}"


# -- the names the docs' prose gives ---------------------------------------------------------------------------------

# A `trainer.`/`run.` key the docs write on purpose although no setting has it: what a user mistypes, shown refused.
KEYS_SHOWN_REFUSED = {"trainer.foo"}
SETTING_NAMED = re.compile(r"(?<![\w./$<-])(trainer|run)\.(?!py\b|log\b)([a-z_]+)\b")
SWALAB_NAMED = re.compile(r"(?<![\w./-])swalab((?:\.[A-Za-z_]\w*)+)")


def settings_named(text: str) -> set[str]:
    """Every ``trainer.<key>`` / ``run.<key>`` that ``text`` names (``trainer.py``, ``run.log`` are files)."""
    return {f"{group}.{key}" for group, key in SETTING_NAMED.findall(text)}


def unknown_settings(text: str) -> set[str]:
    """The ``trainer``/``run`` keys ``text`` names that neither settings class defines, leaving out the keys of earlier
    versions that the docs name as refused (``swalab.compat``) and :data:`KEYS_SHOWN_REFUSED`."""
    from dataclasses import fields

    from swalab.compat import MOVED_KEYS, RESPELLED
    from swalab.settings import RunSettings, TrainerSettings

    known = {f"trainer.{f.name}" for f in fields(TrainerSettings)} | {f"run.{f.name}" for f in fields(RunSettings)}
    return settings_named(text) - known - set(MOVED_KEYS) - set(RESPELLED) - KEYS_SHOWN_REFUSED


# A key of another group the docs write on purpose although no yaml of conf/ has it: shown refused, or a block of one's own.
GROUP_KEYS_SHOWN = {"model.swa.strat", "optimizer.lr", "model.polyak"}
GROUP_NAMED = re.compile(r"(?<![\w./$<+-])((?:model|method|dataset|schedule|optimizer|loss|logger|paths)(?:\.[a-z_][a-z_0-9]*)+)"
                         r"(?![\w(])")


def conf_keys() -> set[str]:
    """Every ``<group>.<key>[.<key>...]`` that some yaml of conf/ defines (an experiment's ``@package _global_`` keys
    under their own group; the recipe blocks under ``model``)."""
    import yaml

    def keys(node, prefix):
        for key, value in (node or {}).items() if isinstance(node, dict) else ():
            if key != "defaults":
                yield f"{prefix}.{key}"
                yield from keys(value, f"{prefix}.{key}")

    found = set()
    for path in CONF_DIR.rglob("*.yaml"):
        text, group = path.read_text(), path.parent.name
        node = yaml.safe_load(text)
        if "@package _global_" in text:
            found |= {k[1:] for k in keys(node, "")}
        else:
            found |= set(keys(node, "model" if group == "recipe" else group))
    return found


def unknown_group_keys(text: str) -> set[str]:
    """The ``model.``/``method.``/``dataset.``/... keys ``text`` names that no yaml of conf/ defines (a call such as
    ``method.last_branch_epoch()`` and a custom model's ``model.arch.*`` left out)."""
    from swalab.compat import MOVED_KEYS, RESPELLED

    named = {m.rstrip(".") for m in GROUP_NAMED.findall(text)} - {""}
    return {k for k in named - conf_keys() - set(MOVED_KEYS) - set(RESPELLED) - GROUP_KEYS_SHOWN
            if not k.startswith("model.arch.")}


def missing_swalab_names(text: str) -> set[str]:
    """The ``swalab.<module>[.<name>...]`` that ``text`` names and that import and attribute lookup cannot find."""
    missing = set()
    for dotted in {m.rstrip(".") for m in SWALAB_NAMED.findall(text)}:
        obj = importlib.import_module("swalab")
        for part in dotted.strip(".").split("."):
            if hasattr(obj, part):
                obj = getattr(obj, part)
                continue
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except (ImportError, AttributeError):
                missing.add(f"swalab{dotted}")
                break
    return missing


def not_tools(text: str) -> set[str]:
    """The ``python -m swalab.<module>`` that ``text`` names and that would do nothing or fail: no such module, or one
    without a ``__main__`` block (a package: without ``__main__.py``)."""
    import importlib.util

    missing = set()
    for name in set(re.findall(r"python -m (swalab[\w.]*\w)", text)):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:  # a package runs its __main__.py
            spec = importlib.util.find_spec(f"{name}.__main__")
        if spec is None or '__name__ == "__main__"' not in Path(spec.origin).read_text() and \
                not spec.origin.endswith("__main__.py"):
            missing.add(name)
    return missing


@pytest.mark.parametrize("finder, what", [
    (lambda text: unknown_settings(text), "no setting of swalab.settings has these keys"),
    (lambda text: unknown_group_keys(text), "no yaml of conf/ has these keys"),
    (lambda text: missing_swalab_names(text), "these names are no longer in swalab"),
    (lambda text: {f"python -m {name}" for name in not_tools(text)}, "no such command"),
], ids=["trainer_and_run_keys_are_settings", "group_keys_are_in_conf", "swalab_names_exist", "tools_run_as_python_m"])
def test_every_key_name_and_tool_the_docs_give_exists(finder, what):
    stale = {f"{path.relative_to(REPO)}: {item}" for path in DOCS for item in finder(path.read_text())}
    assert not stale, f"{what}: {sorted(stale)}"


def test_a_stale_key_or_name_in_a_doc_is_found():
    assert unknown_settings("`run.eval_batch` and `trainer.epochs`; see run.py and trainer.py") == {"run.eval_batch"}
    assert unknown_settings("`trainer.device=cpu` is refused with the key it became") == set()
    assert missing_swalab_names("`swalab.identity.method_part`, `swalab.identity.BRANCH_MAY_DIFFER`, "
                                "`python -m swalab.results.row`, `swalab.results.shift_plots`.") == \
        {"swalab.identity.BRANCH_MAY_DIFFER"}
    assert missing_swalab_names("python -m swalab.results.scores") == {"swalab.results.scores"}
    assert not_tools("`python -m swalab.results.score`, `python -m swalab.posthoc` and `python -m swalab.analysis.`, "
                     "not `python -m swalab.results.shift_summary` (a module without a command) nor "
                     "`python -m swalab.results.scores`") == {"swalab.results.shift_summary", "swalab.results.scores"}
    assert unknown_group_keys("`model.swa.start`, `model.swa.strt`, `method.last_branch_epoch()`, `dataset.val_size`, "
                              "`schedule.horizon`, `optimizer.betas` and `dataset.subset`") == \
        {"model.swa.strt", "dataset.subset"}


FAULT_POINT = re.compile(r"faults\.(?:hit|watch)\([^)]*?\"([a-z_]+)\"")


def fault_points_in(source: str) -> set[str]:
    """The ``SWALAB_FAULT`` points a piece of swalab's code passes through (``faults.hit("x")``, ``faults.watch(.., "x")``)."""
    return set(FAULT_POINT.findall(source))


def test_every_fault_point_the_code_passes_through_is_named_in_reliability_md():
    points = set().union(*(fault_points_in(p.read_text()) for p in (REPO / "src" / "swalab").rglob("*.py")))
    doc = (REPO / "docs" / "reliability.md").read_text()
    section = doc[doc.index("## How faults are placed"):].split("\n## ", 1)[0]
    assert len(points) >= 9 and {p for p in points if f"`{p}`" not in section} == set()
    assert fault_points_in('faults.hit("a_new_point")\nfaults.watch(loader, "other")') == {"a_new_point", "other"}
