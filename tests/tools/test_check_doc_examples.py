#!/usr/bin/env python3
"""Tests of scripts/check_doc_examples.py on small made-up repositories: an excerpt
that matches passes; one that drifted from its file, an unmarked block, and an
excerpt of a file CI does not run all fail, each named."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "check_doc_examples.py")
EXAMPLE = "import x\n\ndef f(group):\n    buf = x.Buffer(group)\n    return buf.dispatch(1)\n"


def check(doc, files=None):
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs", "examples"))
        with open(os.path.join(root, "docs", "examples", "ex.py"), "w") as f:
            f.write(EXAMPLE)
        for path, text in (files or {}).items():
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("# r\n")
        with open(os.path.join(root, "docs", "guide.md"), "w") as f:
            f.write(doc)
        run = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True, check=False)
        return run.returncode, run.stdout


class CheckDocExamplesTest(unittest.TestCase):
    def test_excerpt_with_elisions_passes(self):
        rc, out = check("<!-- excerpt: docs/examples/ex.py -->\n```python\ndef f(group):\n    ...\n"
                        "    return buf.dispatch(1)\n```\n")
        self.assertEqual(rc, 0, out)

    def test_drifted_excerpt_fails(self):
        rc, out = check("<!-- excerpt: docs/examples/ex.py -->\n```python\nbuf = x.Buffer(group, 2)\n```\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("guide.md:2: not an excerpt of docs/examples/ex.py", out)

    def test_lines_out_of_order_fail(self):
        rc, out = check("<!-- excerpt: docs/examples/ex.py -->\n```python\nreturn buf.dispatch(1)\n"
                        "def f(group):\n```\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("out of the file's order", out)

    def test_unmarked_block_fails(self):
        rc, out = check("text\n\n```cpp\nint main() {}\n```\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("guide.md:3: a cpp block without", out)

    def test_synopsis_and_other_languages_pass(self):
        rc, out = check("<!-- synopsis -->\n```cpp\nstruct S { ... };\n```\n\n```sh\nls\n```\n")
        self.assertEqual(rc, 0, out)

    def test_excerpt_of_a_file_ci_does_not_run_fails(self):
        rc, out = check("<!-- excerpt: notes.py -->\n```python\nx = 1\n```\n", {"notes.py": "x = 1\n"})
        self.assertEqual(rc, 1, out)
        self.assertIn("which CI does not build or run", out)


if __name__ == "__main__":
    unittest.main()
