"""utils/report.py's volunteers line: the counts of a metrics row in words, as the step line, report.md and
`rl`'s done line give them (they were only in metrics.jsonl)."""

from composer_prime.utils.report import volunteers_line


def test_volunteers_counts_in_words_summed_over_nodes():
    row = {"step": 29, "reward": 0.5, "volunteers/healthy": 2, "volunteers/ejected": 1, "volunteers/refused/ejected": 6,
           "volunteers/aaaaaaaaaaaa/leased": 344, "volunteers/aaaaaaaaaaaa/accepted": 344, "volunteers/aaaaaaaaaaaa/in_batch": 32,
           "volunteers/bbbbbbbbbbbb/leased": 364, "volunteers/bbbbbbbbbbbb/accepted": 296,
           "volunteers/cccccccccccc/leased": 16, "volunteers/cccccccccccc/rejected:logprobs": 2,
           "volunteers/cccccccccccc/reassigned": 3}
    assert volunteers_line(row) == "volunteers 2 healthy, 1 ejected; 640 of 724 leases accepted, 2 rejected"
    assert volunteers_line({"step": 3, "reward": 0.1}) is None  # a run without volunteers says nothing of them
