"""examples/train_ddp.py stays what a user would copy (issue 44): at most 150 lines of training code.

Test-only knobs belong in npudist/testing/train_knobs.py and what every loop needs in the library
(npudist.checkpoint.LoopCheckpoints, npudist.loop); this fails when either grows back into the example.
"""

import ast
import io
import tokenize

from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "train_ddp.py"
MAX_CODE_LINES = 150
MAX_FILE_LINES = 200
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(source: str) -> int:
    """Lines holding a token of code: blank lines, comments and docstrings (a module's, class's or
    function's first string statement) do not count."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_skips_blanks_comments_and_docstrings_only():
    source = ('"""Module.\n\nMore."""\n\n# a comment\nx = (1,\n     2)  # trailing\n\n\n'
              'def f():\n    """Doc."""\n    return x\n')
    assert code_lines(source) == 4  # x = (1, / 2) / def f(): / return x


def test_the_example_is_at_most_150_lines_of_training_code():
    source = EXAMPLE.read_text()
    assert code_lines(source) <= MAX_CODE_LINES, "move test knobs to npudist/testing/train_knobs.py"
    assert len(source.splitlines()) < MAX_FILE_LINES
