"""raymx.progress: a tqdm bar on a TTY, a line per step elsewhere, with the
interface of the hand-written bar of raymx.spark_bridge.initial_sync."""
import io
import re

from raymx.progress import Progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_no_tty_writes_plain_lines_per_step_and_a_last_one():
    out = io.StringIO()  # not a TTY: no carriage returns, no bar
    p = Progress("member 3: copying from 1", 1000, file=out, every_s=0)
    p.update(250)
    p.update(0)  # nothing new: no line
    p.done = 600  # as wait_caught_up sets it
    p.update(0)
    p.step("member 3: catching up", 40)
    p.update(40)
    p.close()
    p.close()  # once only
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [re.sub(r" \(.*", "", x) for x in lines] == [
        "member 3: copying from 1:   0.0% 0/1,000",
        "member 3: copying from 1:  25.0% 250/1,000",
        "member 3: copying from 1:  60.0% 600/1,000",
        "member 3: catching up:   0.0% 0/40",
        "member 3: catching up: 100.0% 40/40",
        "member 3: catching up: done, 100.0% 40/40"]


def test_no_tty_lines_are_rate_limited():
    out = io.StringIO()
    p = Progress("copy", 10_000, file=out, every_s=60)
    for _ in range(1000):
        p.update(10)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "100.0% 10,000/10,000" in lines[-1]


def test_tty_uses_tqdm():
    out = _Tty()
    with Progress("member 1: catching up", 200, file=out, unit="entries") as p:
        p.update(50, force=True)
        p.done = 200
        p.update(0, force=True)
    text = out.getvalue()
    assert "\r" in text and "member 1: catching up" in text and "200/200" in text
    assert "100%" in text


def test_unknown_total_and_disabled():
    out = io.StringIO()
    p = Progress("backup of member 0", None, file=out)
    p.update(3)
    p.close()
    assert out.getvalue().splitlines()[-1].startswith("backup of member 0: done, 3 (")
    quiet = io.StringIO()
    p = Progress("x", 10, enabled=False, file=quiet)
    p.update(5)
    p.close()
    assert quiet.getvalue() == "" and p.done == 5
