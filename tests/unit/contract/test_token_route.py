"""The token route's answer as the server writes it and the orchestrator reads it back."""

from composer_prime.contract.inference import Completion, Generation, boundary_valid, completion_end, completions, generate_answer


def test_an_answer_reads_back_as_its_generations_in_order():
    gens = [Generation([1, 2], [7, 8, 3], [-0.5, -1.25, -0.125], "stop", weight_version=4),
            Generation([1, 2], [9], [-2.0], "length", weight_version=3)]
    answer = generate_answer([1, 2], gens)
    assert answer["weight_version"] == 3  # the oldest choice's
    assert answer["choices"][0]["logprobs"]["content"][1] == {"token_id": 8, "logprob": -1.25}
    assert completions(answer) == [Completion([7, 8, 3], [-0.5, -1.25, -0.125], "stop", 4),
                                   Completion([9], [-2.0], "length", 3)]


def test_a_choice_without_its_own_version_has_the_answers():
    answer = generate_answer([1], [Generation([1], [5], [-0.25], "stop", weight_version=6)])
    del answer["choices"][0]["weight_version"]  # as a server that stamps only the whole answer writes it
    assert completions(answer) == [Completion([5], [-0.25], "stop", 6)]


def test_a_completion_ends_at_its_first_stop_token_or_fills_its_budget():
    assert completion_end([5, 9, 2, 7, 2], (2,)) == 3 and completion_end([5, 9], (2,)) == 2 and completion_end([], (2,)) == 0
    assert boundary_valid([5, 9, 2], (2, 3), 8)  # ends in a stop token, below the budget
    assert boundary_valid([5, 9, 4, 4], (2,), 4)  # no stop token, fills the budget
    assert not boundary_valid([5, 9, 4], (2,), 4)  # cut short
    assert not boundary_valid([5, 2, 4, 2], (2,), 4)  # drawn on past a stop token, though it fills the budget
    assert not boundary_valid([], (2,), 4) and boundary_valid([6, 6], (), 2) and not boundary_valid([6], (), 2)
