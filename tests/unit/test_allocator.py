"""allocator.py: which library QKNORM_MALLOC picks, and the second start that preloads it."""
import sys

import pytest

from qknorm_pipeline import allocator


def libraries(tmp_path, *names):
    """A folder per name holding an (empty) file of that name; their paths in order."""
    dirs = []
    for i, name in enumerate(names):
        d = tmp_path / f"lib{i}"
        d.mkdir()
        (d / name).write_bytes(b"")
        dirs.append(str(d))
    return dirs


def test_auto_prefers_tcmalloc_then_jemalloc_then_glibc(tmp_path):
    je, tc = libraries(tmp_path, "libjemalloc.so.2", "libtcmalloc_minimal.so.4")
    assert allocator.resolve("auto", [je, tc]) == ("tcmalloc", f"{tc}/libtcmalloc_minimal.so.4")
    assert allocator.resolve("auto", [je]) == ("jemalloc", f"{je}/libjemalloc.so.2")
    assert allocator.resolve("auto", [str(tmp_path)]) == ("system", None)
    assert allocator.resolve("system", [tc]) == ("system", None)


def test_the_first_folder_that_holds_one_wins(tmp_path):
    first, second = libraries(tmp_path, "libtcmalloc.so.4", "libtcmalloc_minimal.so.4")
    assert allocator.resolve("tcmalloc", [first, second]) == ("tcmalloc", f"{first}/libtcmalloc.so.4")
    assert allocator.resolve("tcmalloc", [second, first]) == ("tcmalloc", f"{second}/libtcmalloc_minimal.so.4")


def test_a_choice_that_cannot_be_had_is_one_line_naming_the_fix(tmp_path):
    (je,) = libraries(tmp_path, "libjemalloc.so.2")
    with pytest.raises(ValueError) as e:
        allocator.resolve("tcmalloc", [je])
    assert str(e.value).startswith("QKNORM_MALLOC=tcmalloc: no tcmalloc library (libtcmalloc_minimal.so.4, ") \
        and f"in {je}; install it (apt install libtcmalloc-minimal4" in str(e.value)
    assert str(e.value).endswith("or set QKNORM_MALLOC=system") and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^QKNORM_MALLOC=tc-malloc: give one of auto, tcmalloc, jemalloc, system, or"):
        allocator.resolve("tc-malloc", [je])
    with pytest.raises(ValueError, match=r"^QKNORM_MALLOC=/no/libtcmalloc.so: no such file; give the path"):
        allocator.resolve("/no/libtcmalloc.so", [je])
    assert allocator.resolve(f"{je}/libjemalloc.so.2", []) == ("jemalloc", f"{je}/libjemalloc.so.2")


def test_search_dirs_start_with_the_users_library_path():
    dirs = allocator.search_dirs({"LD_LIBRARY_PATH": "/a:/b", "CONDA_PREFIX": "/conda"})
    assert dirs[:4] == ["/a", "/b", "/conda/lib", f"{sys.prefix}/lib"] and "/usr/lib/x86_64-linux-gnu" in dirs


def test_loaded_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    lines = ["7f0-7f1 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6",
             "7f2-7f3 rw-p 00000000 00:00 0",
             "7f4-7f5 r-xp 00000000 08:01 2 /opt/my libs/libtcmalloc_minimal.so.4.5.10"]
    maps.write_text("\n".join(lines[:2]) + "\n")
    assert allocator.loaded(str(maps)) is None
    maps.write_text("\n".join(lines) + "\n")
    assert allocator.loaded(str(maps)) == "/opt/my libs/libtcmalloc_minimal.so.4.5.10"
    assert allocator.loaded(str(tmp_path / "none")) is None


class Exec:
    def __init__(self):
        self.calls = []

    def __call__(self, path, args, env):
        self.calls.append((path, args, env))


@pytest.fixture
def nothing_loaded(monkeypatch):
    monkeypatch.setattr(allocator, "loaded", lambda maps=None: None)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-u", "-m", "qknorm_pipeline.fairseq_train", "bin", "--cpu"])


def test_a_cpu_run_starts_again_with_the_library_preloaded(tmp_path, nothing_loaded):
    tc, je = libraries(tmp_path, "libtcmalloc_minimal.so.4", "libjemalloc.so.2")
    run = Exec()
    allocator.restart_with_allocator(["bin", "--cpu"], {"LD_PRELOAD": "/x/libfoo.so", "PATH": "/bin"}, run, [tc])
    ((path, args, env),) = run.calls
    # the same command line, interpreter options included
    assert path == sys.executable and args == [sys.executable, "-u", "-m", "qknorm_pipeline.fairseq_train", "bin", "--cpu"]
    lib = f"{tc}/libtcmalloc_minimal.so.4"
    assert env == {"LD_PRELOAD": f"{lib}:/x/libfoo.so", "PATH": "/bin", allocator.STARTED: lib}
    # jemalloc gets its settings, unless the user gave some
    allocator.restart_with_allocator(["--cpu"], {allocator.VAR: "jemalloc"}, run, [je])
    assert run.calls[-1][2]["MALLOC_CONF"] == allocator.JEMALLOC_CONF
    assert run.calls[-1][2]["LD_PRELOAD"] == f"{je}/libjemalloc.so.2"
    allocator.restart_with_allocator(["--cpu"], {allocator.VAR: "jemalloc", "MALLOC_CONF": "narenas:1"}, run, [je])
    assert run.calls[-1][2]["MALLOC_CONF"] == "narenas:1"


def test_no_second_start_for_gpu_runs_glibc_or_a_loaded_allocator(tmp_path, nothing_loaded, monkeypatch):
    (tc,) = libraries(tmp_path, "libtcmalloc_minimal.so.4")
    run = Exec()
    allocator.restart_with_allocator(["bin"], {}, run, [tc])  # no --cpu: a GPU run
    allocator.restart_with_allocator(["bin", "--cpu"], {allocator.VAR: "system"}, run, [tc])
    allocator.restart_with_allocator(["bin", "--cpu"], {}, run, [str(tmp_path)])  # auto, none found
    monkeypatch.setattr(allocator, "loaded", lambda maps=None: "/usr/lib/libjemalloc.so.2")
    allocator.restart_with_allocator(["bin", "--cpu"], {allocator.VAR: "tcmalloc"}, run, [tc])
    assert run.calls == []


def test_a_preload_that_did_not_load_is_an_error_not_a_loop(tmp_path, nothing_loaded):
    (tc,) = libraries(tmp_path, "libtcmalloc_minimal.so.4")
    with pytest.raises(ValueError, match=r"^QKNORM_MALLOC: LD_PRELOAD=\S+libtcmalloc_minimal.so.4 did not load it"):
        allocator.restart_with_allocator(["--cpu"], {allocator.STARTED: "x"}, Exec(), [tc])


def test_the_log_line_names_the_allocator_in_place(monkeypatch):
    monkeypatch.setattr(allocator, "loaded", lambda maps=None: "/usr/lib/libtcmalloc_minimal.so.4.5.10")
    assert allocator.describe({}) == ("memory allocator: tcmalloc (/usr/lib/libtcmalloc_minimal.so.4.5.10)", False)
    monkeypatch.setattr(allocator, "loaded", lambda maps=None: None)
    assert allocator.describe({allocator.VAR: "system"}) == ("memory allocator: glibc's malloc (QKNORM_MALLOC=system)",
                                                             False)
    line, warn = allocator.describe({})
    assert warn and line.startswith("memory allocator: glibc's malloc; no tcmalloc or jemalloc was found") \
        and "apt install libtcmalloc-minimal4" in line


def test_a_tool_started_from_here_gets_the_library_in_its_environment(tmp_path):
    tc, je = libraries(tmp_path, "libtcmalloc_minimal.so.4", "libjemalloc.so.2")
    lib = f"{tc}/libtcmalloc_minimal.so.4"
    env, name = allocator.for_child({"LD_LIBRARY_PATH": tc, "LD_PRELOAD": "/x/libfoo.so"})
    assert name == "tcmalloc" and env["LD_PRELOAD"] == f"{lib}:/x/libfoo.so"
    assert allocator.for_child({"LD_LIBRARY_PATH": tc, allocator.VAR: "system"}) == (
        {"LD_LIBRARY_PATH": tc, allocator.VAR: "system"}, "system")
    # the user's own preload is kept, whatever QKNORM_MALLOC says
    mine = {"LD_LIBRARY_PATH": tc, "LD_PRELOAD": f"{je}/libjemalloc.so.2", allocator.VAR: "tcmalloc"}
    assert allocator.for_child(mine) == (mine, "jemalloc")
    with pytest.raises(ValueError, match="^QKNORM_MALLOC=jemalloc: no jemalloc library"):
        allocator.for_child({"LD_LIBRARY_PATH": tc, allocator.VAR: "jemalloc"})


def test_evaluate_decodes_on_a_cpu_with_the_allocator_and_says_when_there_is_none(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from qknorm_pipeline import evaluate

    (tc,) = libraries(tmp_path, "libtcmalloc_minimal.so.4")
    cfg = SimpleNamespace(cpu=SimpleNamespace(threads=0, isa=None))
    monkeypatch.delenv(allocator.VAR, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(evaluate, "has_gpu", lambda: False)
    monkeypatch.setattr(allocator, "search_dirs", lambda environ=None: [tc])
    env, words = evaluate.decoding_env(cfg, ["fairseq-generate", "bin"])
    assert env["LD_PRELOAD"] == f"{tc}/libtcmalloc_minimal.so.4" and words == " (tcmalloc)"
    monkeypatch.setattr(allocator, "search_dirs", lambda environ=None: [str(tmp_path)])
    env, words = evaluate.decoding_env(cfg, ["fairseq-generate", "bin"])
    assert "LD_PRELOAD" not in env and words == " (glibc's malloc)"
    assert "warning: decoding with glibc's malloc: no tcmalloc or jemalloc was found" in capsys.readouterr().err
    # a GPU decodes without it, unless --cpu is given
    monkeypatch.setattr(evaluate, "has_gpu", lambda: True)
    monkeypatch.setattr(allocator, "search_dirs", lambda environ=None: [tc])
    env, words = evaluate.decoding_env(cfg, ["fairseq-generate", "bin"])
    assert "LD_PRELOAD" not in env and words == ""
    assert evaluate.decoding_env(cfg, ["fairseq-generate", "bin", "--cpu"])[1] == " (tcmalloc)"
