"""The rewritten model_new.py of a single-file solution: the prebuilt module instead of load_inline.

What it is: `rewrite(source, spec) -> str` (step 2 of `rewards.inline.prepare`): `ext = load_inline(...)`
at module level becomes `import cuda_extension as ext` (the static checks know import aliases),
any other call site becomes the name `cuda_extension` with `import cuda_extension;` in front of the
first top-level statement; imports of torch.utils.cpp_extension become `pass`. Edits are byte
ranges of the AST's positions and keep line numbers, so tracebacks point at the author's lines.
What it is not: the extraction of the call (`rewards.inline.extract`, whose `InlineSpec.call`
locates it) or the build (`rewards.inline.sources`). `rewards.inline.prepare` re-exports `rewrite`.

Example:
    model_new = rewrite(source, extract(source))
"""

from __future__ import annotations

import ast

from rewards.inline.extract import CPP_EXTENSION, InlineSpec, UnsupportedInline


def _offsets(source: bytes) -> list[int]:
    """Byte offset of the start of each line (1-based: index 0 is unused)."""
    starts = [0, 0]
    for i, byte in enumerate(source):
        if byte == 10:
            starts.append(i + 1)
    return starts


def _import_edits(tree: ast.Module) -> list[tuple[ast.stmt, str]]:
    """Statements importing torch.utils.cpp_extension and what replaces them."""
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            hits = [a for a in node.names
                    if node.module.startswith(CPP_EXTENSION) or f"{node.module}.{a.name}" == CPP_EXTENSION]
            if hits and len(hits) != len(node.names) and not node.module.startswith(CPP_EXTENSION):
                raise UnsupportedInline(f"line {node.lineno}: cpp_extension imported with other names")
            if hits:
                edits.append((node, "pass"))
        elif isinstance(node, ast.Import) and any(a.name.startswith(CPP_EXTENSION) for a in node.names):
            if len(node.names) != 1:
                raise UnsupportedInline(f"line {node.lineno}: cpp_extension imported with other modules")
            edits.append((node, "pass" if node.names[0].asname else "import torch"))
    return edits


def _first_statement(tree: ast.Module) -> ast.stmt | None:
    for i, stmt in enumerate(tree.body):
        docstring = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if not (docstring or future):
            return stmt
    return None


def rewrite(source: str, spec: InlineSpec) -> str:
    """model_new.py importing the prebuilt `cuda_extension` instead of calling load_inline."""
    tree = ast.parse(source)
    data = source.encode()
    starts = _offsets(data)

    def span(node_or_pos) -> tuple[int, int, int]:
        line, col, end_line, end_col = node_or_pos
        return starts[line] + col, starts[end_line] + end_col, end_line - line

    edits = []  # (start, end, text), byte offsets
    for node, text in _import_edits(tree):
        start, end, lines = span((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset))
        edits.append((start, end, text + "\n" * lines))
    call_start, call_end, call_lines = span(spec.call)
    if spec.target:
        top = next(s for s in tree.body if s.lineno <= spec.call[0] <= s.end_lineno)
        start, end, lines = span((top.lineno, top.col_offset, top.end_lineno, top.end_col_offset))
        edits.append((start, end, f"import cuda_extension as {spec.target}" + "\n" * lines))
    else:
        edits.append((call_start, call_end, "(cuda_extension)" + "\n" * call_lines))
        first = _first_statement(tree)
        at = starts[first.lineno] if first is not None else len(data)
        compound = first is not None and isinstance(first, (ast.ClassDef, ast.FunctionDef, ast.If, ast.With, ast.For, ast.Try, ast.AsyncFunctionDef, ast.While))
        edits.append((at, at, "import cuda_extension\n" if compound or first is None else "import cuda_extension; "))
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        data = data[:start] + text.encode() + data[end:]
    rewritten = data.decode()
    try:
        ast.parse(rewritten)
    except SyntaxError as exc:
        raise UnsupportedInline(f"the call site cannot be rewritten: {exc}") from None
    return rewritten
