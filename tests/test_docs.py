"""The Python examples of README.md and docs/*.md run, and print what the pages show.

Every fenced ``python`` block is one of:

* ``>>>`` examples: run with doctest (ELLIPSIS), all blocks of one page in one
  namespace, in page order, in a fresh empty directory;
* a script that names itself on its first line (``# name.py``): written to a
  fresh directory and run as ``python name.py`` (scripts that start processes
  do so through ``treecoll.collectives.launch``); the page shows a
  ``$ python name.py`` transcript right after it, and the output must be
  exactly the lines shown (the scripts of :data:`IN_ONE_PROCESS` run their
  ``work`` function in this process instead, with their own check);
* anything else: executed in a fresh namespace in a fresh directory.

A block that another test runs is listed in :data:`RUN_ELSEWHERE` with that test.
"""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SCRIPT_NAME = re.compile(r"\A# (\w+\.py)\n")
#: (page, script name) -> the test that runs that block as part of a longer flow
RUN_ELSEWHERE = {
    (
        "README.md",
        "allreduce_tree.py",
    ): "tests/collectives/test_gloo.py::test_readme_tree_file_flow_four_processes (needs the flow's tree.yaml)",
}


def _blocks(page: str) -> list[tuple[str, str, int]]:
    """(language, text, line of the opening fence) of every fenced block of ``page``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def _python_blocks(page: str):
    blocks = _blocks(page)
    for i, (lang, text, line) in enumerate(blocks):
        if lang == "python":
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            yield text, line, after


def _scripts():
    for page in PAGES:
        for text, _line, after in _python_blocks(page):
            m = SCRIPT_NAME.match(text)
            if m and (page, m.group(1)) not in RUN_ELSEWHERE:
                shown = None
                if after and after[0] == "" and after[1].startswith(f"$ python {m.group(1)}\n"):
                    shown = after[1].splitlines()[1:]
                yield pytest.param(page, m.group(1), text, shown, id=f"{page}:{m.group(1)}")


def _plain_blocks():
    for page in PAGES:
        for text, line, _ in _python_blocks(page):
            if ">>>" not in text and not SCRIPT_NAME.match(text):
                yield pytest.param(page, line, text, id=f"{page}:{line}")


def test_every_python_block_is_run_somewhere():
    """A block that starts processes is a named script (it can only run as a file), and every block
    said to run elsewhere is still on its page."""
    named = set()
    for page in PAGES:
        for text, line, _ in _python_blocks(page):
            m = SCRIPT_NAME.match(text)
            named.add((page, m.group(1)) if m else None)
            if re.search(r"\blaunch\.(?:run|spawn|join|RankPool|run_commands)\(", text):
                assert m, f"{page}:{line}: a block that starts processes needs '# name.py' on its first line"
    assert set(RUN_ELSEWHERE) <= named


@pytest.mark.parametrize("page", [p for p in PAGES if any(">>>" in text for text, _, _ in _python_blocks(p))])
def test_doctest_examples(page, tmp_path, monkeypatch):
    examples = [(text, line) for text, line, _ in _python_blocks(page) if ">>>" in text]
    monkeypatch.chdir(tmp_path)
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs: dict = {"__name__": "docs_example"}
    for text, line in examples:
        test = parser.get_doctest(text, globs, f"{page}:{line}", page, line)
        runner.run(test, clear_globs=False)
        globs = test.globs  # the next block sees what this one defined (DocTest copies its globals)
    assert runner.summarize(verbose=False).failed == 0, f"{page}: examples failed (doctest output above)"


@pytest.mark.parametrize("page,line,text", list(_plain_blocks()))
def test_plain_blocks(page, line, text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(text, f"{page}:{line}", "exec"), {"__name__": "docs_example"})  # noqa: S102 - the page's own code


#: scripts whose ``work(rank, nproc)`` runs here in this process, as a group of one, instead of as
#: ``python name.py`` (the script's processes would each import transformers: too slow for this test);
#: the same calls over 2 and 4 processes are
#: tests/attention/test_hf.py::test_model_generate_with_tree_cache_equals_hf_generate
IN_ONE_PROCESS = {"hf_generate.py"}


@pytest.mark.parametrize("page,name,text,shown", [p for p in _scripts() if p.values[1] not in IN_ONE_PROCESS])
def test_scripts(page, name, text, shown, tmp_path):
    (tmp_path / name).write_text(text, encoding="utf-8")
    run = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"{page}: python {name} failed:\n{run.stderr}"
    assert shown is not None, f"{page}: show what python {name} prints ($ python {name} and its output)"
    assert run.stdout.splitlines() == shown, f"{page}: python {name} printed\n{run.stdout}"


def test_readme_hf_generate_equals_the_models_own_generate(tmp_path, monkeypatch):
    """The README's Hugging Face example: its ``work`` on a small random Llama saved the Hugging Face
    way as ``llama/`` gives the model's own greedy tokens (one process: a group of one, with the
    TreeCache and the tree_decode attention)."""
    tf = pytest.importorskip("transformers", reason="optional extra transformers not installed")
    from treecoll.attention.model import LlamaConfig, LlamaModel, save_checkpoint

    [(page, name, text, _)] = [p.values for p in _scripts() if p.values[1] == "hf_generate.py"]
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    save_checkpoint(LlamaModel.random(config, seed=1), tmp_path / "llama", format="safetensors")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "docs_example"}
    exec(compile(text, f"{page}:{name}", "exec"), namespace)  # noqa: S102 - the page's own code
    tokens = namespace["work"](0, 1)
    import torch

    model = tf.AutoModelForCausalLM.from_pretrained("llama").eval()
    prompt = torch.tensor([[1, 5, 7, 9, 11]])
    want = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False, pad_token_id=0
    )[:, prompt.shape[1] :]
    assert tokens == want.tolist() and len(set(tokens[0])) > 1, (tokens, want)


#: ``$ treecoll`` transcripts whose command needs what the page made earlier (files, processes, a
#: network namespace) or this machine (timings): the words that mark them
NOT_REPLAYED = ("/tmp/", ".log", "probed.yaml", "tree.yaml", "emu ", "decode --nproc", "selfcheck", "calibrate")


def _transcripts():
    """(page, line, argv, shown lines) of every ``$ treecoll`` command shown in a plain fenced block."""
    for page in PAGES:
        for lang, text, line in _blocks(page):
            if lang:
                continue
            cmd, shown, at = None, [], line
            for i, row in enumerate([*text.splitlines(), "$ end"]):
                if row.startswith("$ "):
                    if cmd is not None and not any(w in cmd for w in NOT_REPLAYED):
                        yield pytest.param(page, cmd, shown, id=f"{page}:{at}")
                    cmd, shown, at = (row[2:] if row.startswith("$ treecoll ") else None), [], line + i + 1
                elif cmd is not None:
                    shown.append(row.rstrip())


@pytest.mark.parametrize(("page", "cmd", "shown"), list(_transcripts()))
def test_cli_transcripts_print_what_the_pages_show(page, cmd, shown, capsys, monkeypatch):
    """Every line a page shows under a ``$ treecoll`` command (``...`` marks lines left out) is a
    line the command prints today, in the same order: the pages cannot drift from the tool."""
    import shlex

    from treecoll.tools.cli import main

    monkeypatch.chdir(ROOT)
    main(shlex.split(cmd)[1:])
    cap = capsys.readouterr()
    printed = [x.rstrip() for x in (cap.out + cap.err).splitlines()]
    at = 0
    for want in shown:
        if want.strip() == "..." or not want:
            continue
        while at < len(printed) and printed[at] != want:
            at += 1
        assert at < len(printed), f"{page}: `{cmd}` no longer prints {want!r} (or not in the page's order)"
        at += 1
