"""The suite's own scheduling (tests/conftest.py): under `-n ... --dist loadfile`, the files of LONGEST_FIRST go to the
workers first, in that order. pytest-xdist reorders a loadfile run's files by their number of tests unless told not to,
which put the suite's heaviest files, one or two tests each, at the end of the run. A small pytest session with the
suite's conftest as its plug-in, on one worker: a one-test file named as the first of LONGEST_FIRST runs before a file
of six tests."""

import subprocess
import sys

from tests.conftest import LONGEST_FIRST, ROOT

TEST = "import os\n\ndef test_{i}():\n    open(os.environ['ORDER_LOG'], 'a').write('{name}\\n')\n"


def test_the_longest_files_are_handed_out_first_not_the_files_with_most_tests(tmp_path):
    first, many = LONGEST_FIRST[0], "test_zz_many.py"
    (tmp_path / first).write_text(TEST.format(i=0, name=first))
    (tmp_path / many).write_text("\n\n".join(TEST.format(i=i, name=many) for i in range(6)))
    log = tmp_path / "order.log"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
                           "-n", "1", "--dist", "loadfile", str(tmp_path / many), str(tmp_path / first)],
                          cwd=ROOT, env={"ORDER_LOG": str(log), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert log.read_text().splitlines() == [first] + [many] * 6
