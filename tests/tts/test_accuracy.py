"""Answer grading (math-verify): boxed extraction, equivalence, Top-1 and Pass@N on hand-made paths."""
import json

import pytest

from systems.tts.accuracy import answer_key, extract_answer, grade_problem, is_correct


@pytest.mark.parametrize("text,gold,ok", [
    ("so $x = \\boxed{\\frac{1}{2}}$", "0.5", True),
    ("Therefore, the final answer is: $\\boxed{27}$. I hope it is correct.", "27.0", True),   # AMC floats
    ("\\boxed{3}", "4", False),
    ("the answer is 4", "4", False),                                  # no boxed answer -> wrong
    ("\\boxed{4", "4", False),                                        # unclosed box -> no answer
    ("a guess \\boxed{1} is wrong.\n\n" + "We redo the computation carefully step by step. " * 2 + "So \\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}", True),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{8}", False),
])
def test_is_correct(text, gold, ok):
    assert is_correct(text, gold) is ok


def test_extract_answer_nested_braces():
    assert extract_answer("hence $\\boxed{\\frac{a^{2}}{b_{1}+\\sqrt{c}}}$ done") == "\\frac{a^{2}}{b_{1}+\\sqrt{c}}"
    assert extract_answer("\\fbox{x^{2}}") == "x^{2}"
    assert extract_answer("no box at all $x=2$") is None


def test_reference_answers_grade_as_their_own_boxed_form(shared_data):
    # every AIME/AMC reference answer and the first 60 MATH-500 ones, boxed, are correct
    for name, k in (("aime24", 30), ("amc23", 40), ("math500", 60)):
        lines = (shared_data / "math" / name / "test.jsonl").read_text().splitlines()[:k]
        for line in lines:
            a = str(json.loads(line)["answer"])
            assert is_correct(f"The final answer is $\\boxed{{{a}}}$.", a), (name, a)


def test_top1_weighted_vote_and_pass_at_n():
    texts = ["\\boxed{5}", "\\boxed{7}", "\\boxed{5.0}", "no answer", "\\boxed{7}"]
    scores = [[0.1, 0.5], [0.2, 0.9], [0.6], [0.99], [0.3]]
    # last-step scores 0.5, 0.9, 0.6, 0.99, 0.3: "7" sums 1.2, beating "5" and "5.0" (1.1 even together)
    g = grade_problem(texts, scores, "7", n=4)
    assert g.top1_answer == "7" and g.top1_correct and g.top1_naive_correct is False   # naive: the unanswered path
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


def test_answer_key_normalises_spacing():
    assert answer_key("\\frac{1}{2} ") == answer_key("\\frac {1}{2}")
