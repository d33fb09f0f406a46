"""Answer grading by the MATH / search-and-learn convention: boxed extraction, equivalence, Top-1
and Pass@N on hand-made paths."""

import json

import pytest

from systems.verifier_search.accuracy import equivalent, extract_answer, grade_problem, is_correct, normalize


@pytest.mark.parametrize(
    "text,gold,ok",
    [
        ("... so $\\boxed{8}$. Actually I made an error; the answer is $\\boxed{9}$.", "9", True),
        ("Thus the answer is $\\boxed 7$. Done.", "7", True),
        ("$\\boxed{25\\%}$", "25", True),
        ("$\\boxed{30^\\circ}$", "30", True),
        ("$\\boxed{\\frac{2}{5^{40}}}$", "\\frac{2}{5^{41}}", False),
    ],
)
def test_issue_inputs(text, gold, ok):
    """The grading inputs of issue 11. Mutations caught: taking the first box, or joining boxes
    (8,9); taking the rest of the text after ``\\boxed `` ("7$. Done."); math-verify's 6-decimal
    rounding instead of the relative test (2/5^40 == 2/5^41)."""
    assert is_correct(text, gold) is ok


@pytest.mark.parametrize(
    "a,b,eq",
    [
        ("25\\%", "25", True),
        ("30^\\circ", "30", True),
        ("5\\text{ cm}", "5", True),
        ("x = 5", "5", True),
        ("\\text{(C)}", "(C)", True),
        ("2", "2,3", False),
        ("0.5", "\\frac{1}{2}", True),
        ("10^{-12}", "2 \\cdot 10^{-12}", False),
        ("1000000", "999999", False),
        ("\\sqrt{8}", "2\\sqrt{2}", True),
    ],
)
def test_equivalence_is_symmetric(a, b, eq):
    """Units, %, degrees, ``x =`` and a wrapping ``\\text`` on either side; tiny values compared
    relatively, integers exactly. Mutations caught: normalising only one side; an absolute tolerance
    (1e-12 vs 2e-12); the relative tolerance on integers (1000000 vs 999999)."""
    assert equivalent(a, b) is eq and equivalent(b, a) is eq


def test_vote_groups_equivalent_answers():
    """Issue 11: scores 0.3, 0.3, 0.5 on 1/2 (two spellings) and 3 -> the 1/2 group (0.6) wins.
    Mutation caught: grouping the vote by answer string (\\frac{1}{2} and 0.5 split their weight)."""
    g = grade_problem(
        ["so \\boxed{\\frac{1}{2}}", "so \\boxed{0.5}", "so \\boxed{3}"], [[0.3], [0.3], [0.5]], "1/2", n=3
    )
    assert g.top1_correct and equivalent(g.top1_answer, "1/2")
    assert not g.top1_naive_correct and g.correct == 2 and g.pass_at_n


@pytest.mark.parametrize(
    "text,gold,ok",
    [
        ("so $x = \\boxed{\\frac{1}{2}}$", "0.5", True),
        ("Therefore, the final answer is: $\\boxed{27}$. I hope it is correct.", "27.0", True),  # AMC floats
        ("\\boxed{3}", "4", False),
        ("the answer is 4", "4", False),  # no boxed answer -> wrong
        ("\\boxed{4", "4", False),  # unclosed box -> no answer
        (
            "a guess \\boxed{1} is wrong.\n\n"
            + "We redo the computation carefully step by step. " * 2
            + "So \\boxed{\\dfrac{14}{3}}",
            "\\frac{14}{3}",
            True,
        ),
        ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
        ("\\boxed{2\\sqrt{3}}", "\\sqrt{8}", False),
    ],
)
def test_is_correct(text, gold, ok):
    assert is_correct(text, gold) is ok


def test_extract_answer_nested_braces():
    assert extract_answer("hence $\\boxed{\\frac{a^{2}}{b_{1}+\\sqrt{c}}}$ done") == "\\frac{a^{2}}{b_{1}+\\sqrt{c}}"
    assert extract_answer("\\fbox{x^{2}}") == "x^{2}"
    assert extract_answer("no box at all $x=2$") is None
    assert extract_answer("\\boxed{2} and \\boxed{3}") == "3"  # never joined
    assert extract_answer("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # escaped braces do not count
    assert extract_answer("\\boxed{3} then \\boxed{4") is None  # the last box is not closed
    assert extract_answer("Thus the answer is $\\boxed 7$. Done.") == "7"  # not the rest of the text
    assert extract_answer("so \\boxed -3.") == "-3"


def test_normalize_rules():
    """One normalisation for both sides (MATH ``strip_string``). Mutation caught: dropping a rule
    (math-verify alone forgives some of them, e.g. ``x = 5``)."""
    assert normalize("x = \\frac{1}{2}") == normalize("\\dfrac{1}{2}") == "\\frac{1}{2}"
    assert normalize("25\\%") == "25" and normalize("30^{\\circ}") == "30"
    assert normalize("5\\text{ cm}^2") == "5" and normalize("\\text{Evelyn}") == "Evelyn"
    assert normalize("\\$ 4.50.") == "4.50" and normalize("\\left( 1, 2 \\right)") == "(1,2)"


def _reference_answers_grade_as_their_own_boxed_form(data):
    for name in ("aime24", "amc23", "math500"):
        lines = (data / "math" / name / "test.jsonl").read_text().splitlines()
        for line in lines:
            a = str(json.loads(line)["answer"])
            assert is_correct(f"The final answer is $\\boxed{{{a}}}$.", a), (name, a)


def test_reference_answers_grade_as_their_own_boxed_form():
    """Each set's first problems (the fixture slices): the reference answer, boxed, is correct."""
    from tests.conftest import FIXTURE_DATA

    _reference_answers_grade_as_their_own_boxed_form(FIXTURE_DATA)


@pytest.mark.full_data("math/")
def test_every_reference_answer_grades_as_its_own_boxed_form(full_data):
    """All 570 problems of the three sets."""
    _reference_answers_grade_as_their_own_boxed_form(full_data)


def test_top1_weighted_vote_and_pass_at_n():
    texts = ["\\boxed{5}", "\\boxed{7}", "\\boxed{5.0}", "no answer", "\\boxed{7}"]
    scores = [[0.1, 0.5], [0.2, 0.9], [0.6], [0.99], [0.3]]
    # last-step scores 0.5, 0.9, 0.6, 0.99, 0.3: "7" sums 1.2, beating "5" and "5.0" (1.1 even together)
    g = grade_problem(texts, scores, "7", n=4)
    assert g.top1_answer == "7" and g.top1_correct and g.top1_naive_correct is False  # naive: the unanswered path
    assert g.pass_at_n and g.paths == 5 and g.answered == 4 and g.correct == 2
    g = grade_problem(texts, scores, "5", n=4)
    assert not g.top1_correct and g.pass_at_n and g.correct == 2
    # Pass@N looks at the N best-ranked paths only: ranks 0.99, 0.9, 0.6 | 0.5, 0.3
    g = grade_problem(texts, [[0.5], [0.9], [0.2], [0.99], [0.3]], "5", n=2)
    assert not g.pass_at_n and g.correct == 2
    # only wrong answers / no answers
    g = grade_problem(["\\boxed{1}", "x"], [[0.4], [0.8]], "2", n=2)
    assert (g.top1_correct, g.pass_at_n, g.top1_answer) == (False, False, "1")
    g = grade_problem(["x", "y"], [[0.4], [0.8]], "2", n=2)
    assert g.top1_answer is None and not g.top1_correct and g.answered == 0


def test_grade_problem_bad_arguments():
    with pytest.raises(ValueError, match="2 texts but 1"):
        grade_problem(["a", "b"], [[0.1]], "1", n=1)
    with pytest.raises(ValueError, match="n=0"):
        grade_problem(["a"], [[0.1]], "1", n=0)


def test_pass_at_n_counts_the_nth_ranked_path():
    """The only correct path is ranked exactly N-th (N = 2): Pass@N holds, Pass@1 does not. Issue 39:
    Pass@N over the N-1 best paths passed every test. Mutation caught: ``order[: n - 1]``."""
    texts = ["\\boxed{7}", "\\boxed{5}", "\\boxed{9}"]
    scores = [[0.9], [0.6], [0.3]]
    assert grade_problem(texts, scores, "5", n=2).pass_at_n
    assert not grade_problem(texts, scores, "5", n=1).pass_at_n
