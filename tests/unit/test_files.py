"""qknorm_pipeline/files.py: lines cut at "\\n" only, writes that appear complete or not at all."""
import os

import pytest

from qknorm_pipeline import files


def test_lines_round_trip_with_odd_characters(tmp_path):
    lines = ["a\x85b", "c\u2028d", "", "lone\rcr"]
    files.write_lines(tmp_path / "x.txt", lines)
    assert (tmp_path / "x.txt").read_bytes() == "a\x85b\nc\u2028d\n\nlone\rcr\n".encode()
    assert files.read_lines(tmp_path / "x.txt") == lines


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "sub" / "table.md"
    files.write_atomic(path, "old\n")  # creates the folder
    with pytest.raises(RuntimeError):
        with files.atomic_path(path) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("disk full")
    assert path.read_text() == "old\n" and os.listdir(tmp_path / "sub") == ["table.md"]
    files.write_atomic(path, "new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path / "sub") == ["table.md"]



def test_a_folder_is_replaced_whole_or_not_at_all(tmp_path):
    out = tmp_path / "pair" / "raw"
    with files.atomic_dir(out) as tmp:
        files.write_atomic(os.path.join(tmp, "a.txt"), "old\n")
    with pytest.raises(RuntimeError):
        with files.atomic_dir(out) as tmp:
            files.write_atomic(os.path.join(tmp, "b.txt"), "half\n")
            raise RuntimeError("disk full")
    assert os.listdir(out) == ["a.txt"] and os.listdir(tmp_path / "pair") == ["raw"]
    # staged elsewhere (a study's record: outside the folder that compare lists)
    with files.atomic_dir(out, stage_in=tmp_path / "stage") as tmp:
        assert os.path.dirname(tmp) == str(tmp_path / "stage")
        files.write_atomic(os.path.join(tmp, "b.txt"), "new\n")
    assert os.listdir(out) == ["b.txt"] and os.listdir(tmp_path / "stage") == []
    # the folder gets the mode os.makedirs gives one (readable by a shared cluster's group), not 0700
    os.makedirs(tmp_path / "plain")
    assert os.stat(out).st_mode & 0o777 == os.stat(tmp_path / "plain").st_mode & 0o777 != 0o700


def test_read_json_names_the_file_and_the_fix(tmp_path):
    from qknorm_pipeline.cli import UserError

    path = tmp_path / "scores.json"
    path.write_text('{"systems": {"a": 1}}')
    assert files.read_json(str(path), "unused") == {"systems": {"a": 1}}
    path.write_text('{"systems": {"a"')  # cut short
    with pytest.raises(UserError, match=rf"^{path}: not valid JSON \(Expecting ':' delimiter at line 1, column 17\): "
                                        r"evaluate it again$"):
        files.read_json(str(path), "evaluate it again")
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match=rf"^{path}: holds a list, not a dict: fix$"):
        files.read_json(str(path), "fix")
    assert files.read_json(str(path), "fix", kind=list) == [1, 2]


def test_count_lines_cuts_where_split_lines_does(tmp_path):
    path = tmp_path / "test.en"
    for data in (b"a\rb\nc\r\n\xe2\x80\xa8d\n", b"a\nb", b"", b"\n\n"):  # a lone \r and U+2028 stay inside a line
        path.write_bytes(data)
        assert files.count_lines(str(path)) == len(files.read_lines(str(path))), data


def test_a_path_that_cannot_be_read_or_written_is_one_line_and_the_folder_hint_only_for_output_folders(
        tmp_path, monkeypatch, capsys):
    from qknorm_pipeline import cli

    monkeypatch.setenv("DATA_BIN", str(tmp_path / "bin"))

    def opening(path):
        def run(args):
            open(path, encoding="utf-8")
        return run

    for path, hint in ((tmp_path / "given.txt", False), (tmp_path / "bin" / "gl-en" / "stats.json", True)):
        assert cli.main(opening(path), cli.Parser(tag="step"), []) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"[step] error: {path}: No such file or directory; check that path") and err.count("\n") == 1
        assert ("the output folders are DATA_DIR" in err) == hint, err


def test_a_locked_folder_refuses_or_waits_as_its_caller_says(tmp_path):
    def refuse():
        raise RuntimeError("busy")

    with files.locked(tmp_path, refuse):
        with pytest.raises(RuntimeError, match="busy"):  # another open of the folder: another process's lock
            with files.locked(tmp_path, refuse):
                pass
    with files.locked(tmp_path, refuse):  # released when the block ends
        pass
