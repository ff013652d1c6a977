"""The redactor costs a hostile line what it costs a plain one (config/secretnames.py): a
client's prompt reaches it in vLLM's request log (--enable-log-requests), in the thread that
reads vLLM's stdout, so a quadratic rule stalls vLLM on its own log (a 16 K-backslash prompt
after `key=\\"` took 3.9 s; 32 K, 20 s)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.hostile import MIXES, PIECES, best, shapes
from tests.support.secrets import leaks
from vllmwatch.config.redact import REDACTED, Redactor

R = Redactor(known=False)
SIZE = 32 * 1024
RATIO = 20  # times a plain line's cost: a linear rule's constant, far below a quadratic's
CAP_S = 0.5  # and never more than this for 32 KiB (1 s per 64 KiB), however fast the box


def _plain(size: int) -> str:
    """A vLLM request log line of `size` characters, a secret name in each request."""
    one = ("INFO 01-01 00:00:00 [logger.py:43] Received request cmpl-1: prompt: 'hi', "
           "api_key=abc, params: SamplingParams(n=1, max_tokens=16) ")
    return (one * (size // len(one) + 1))[:size]


def test_every_hostile_line_costs_what_a_plain_line_of_its_length_costs() -> None:
    plain = _plain(SIZE)
    bound = min(RATIO * best(lambda: R.text(plain), 5), CAP_S)
    for name, line in shapes(SIZE).items():
        took = best(lambda: R.text(line), 1)  # noqa: B023 (timed here, in this iteration)
        if took > bound:  # once may be the box: the least of three more says, beside a plain
            took = best(lambda: R.text(line), 3)  # noqa: B023 line's cost taken again (a
            # loaded box slowed the hostile line, not the plain one timed before it)
            bound = max(bound, min(RATIO * best(lambda: R.text(plain), 3), CAP_S))
        assert took <= bound, f"{name}: {took:.3f} s, over {bound:.3f} s"


def test_the_reported_lines_are_redacted_in_linear_time() -> None:
    """The review's lines, at 64 KiB: a prompt of backslashes after `key=\\"` as vLLM logs
    it, and a backslash run after a bare secret word."""
    prompt = 'key=\\"' + "\\" * (64 * 1024)
    logged = (f"INFO 01-01 00:00:00 [logger.py:43] Received request cmpl-1: prompt: "
              f"{prompt!r}, params: SamplingParams(n=1)")
    plain = _plain(len(logged))
    bound = min(RATIO * best(lambda: R.text(plain), 3), 2 * CAP_S * len(logged) / SIZE)
    for line in (logged, "token " + "\\" * len(logged), "password" + "\\" * len(logged)):
        took = best(lambda: R.text(line), 1)  # noqa: B023
        assert took <= bound, (line[:40], took, bound)
    assert R.text('x key=\\"abc\\" y') == 'x key=\\"<redacted>\\" y'


# a few hostile pieces, each repeated up to a few thousand times (up to ~50 KiB in all)
_HOSTILE = st.lists(st.tuples(st.sampled_from(PIECES + MIXES + ("a", "\n", ",;&]")),
                              st.integers(500, 4000)),
                    min_size=1, max_size=3).map(lambda parts: "".join(p * k for p, k in parts))


@settings(max_examples=60, deadline=None)
@given(leaks(), _HOSTILE)
@example(("HF_TOKEN=Zq9XkLmP42", "Zq9XkLmP42"), "\\" * 8000)  # the reported shapes, always
@example(("api_key: Zq9XkLmP42", "Zq9XkLmP42"), 'key=\\"' + "\\" * 8000)
def test_a_secret_before_hostile_text_is_hidden_in_linear_time(leak: tuple[str, str],
                                                               rest: str) -> None:
    """Whatever follows on the next line, the secret is hidden and the cost stays a plain
    line's (a quadratic rule takes seconds at these lengths)."""
    text, secret = leak
    line = f"{text}\n{text.split(secret)[0]}{rest}"  # after the secret's own name too
    plain = _plain(len(line))
    bound = max(RATIO * best(lambda: R.text(plain), 3), 0.05)
    took = best(lambda: R.text(line), 1)
    if took > bound:
        took = best(lambda: R.text(line), 3)
    out = R.text(line)
    assert secret not in out and REDACTED in out
    assert took <= bound, (line[:80], took, bound)
