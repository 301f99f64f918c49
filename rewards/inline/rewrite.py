"""The rewritten model_new.py of a single-file solution: the prebuilt module instead of load_inline.

What it is: `rewrite(source, spec) -> str` (step 2 of `rewards.inline.prepare`): `ext = load_inline(...)`
at module level becomes `import cuda_extension as ext` (the static checks know import aliases),
or `from cuda_extension import <attr> as ext` when the file builds several modules; any other
call site becomes `(cuda_extension)` or `(cuda_extension.<attr>)`, with `import cuda_extension;`
in front of the first top-level statement; imports of torch.utils.cpp_extension are dropped (a
statement left empty becomes `pass`). Edits are byte ranges of the AST's positions and keep line
numbers, so tracebacks point at the author's lines.
What it is not: the extraction of the calls (`rewards.inline.extract`, whose `InlineSpec.calls`
locate them) or the build (`rewards.inline.sources`). `rewards.inline.prepare` re-exports `rewrite`.

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
    """Statements importing torch.utils.cpp_extension and what replaces them: the same import
    without it (`import torch` where a plain `import torch.utils.cpp_extension` bound `torch`)."""
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            keep = [a for a in node.names if not (node.module.startswith(CPP_EXTENSION)
                                                  or f"{node.module}.{a.name}" == CPP_EXTENSION)]
            if len(keep) != len(node.names):
                rest = ast.ImportFrom(module=node.module, names=keep, level=0)
                edits.append((node, ast.unparse(rest) if keep else "pass"))
        elif isinstance(node, ast.Import) and any(a.name.startswith(CPP_EXTENSION) for a in node.names):
            keep = [a if not a.name.startswith(CPP_EXTENSION) else ast.alias(name="torch")
                    for a in node.names if not (a.name.startswith(CPP_EXTENSION) and a.asname)]
            edits.append((node, ast.unparse(ast.Import(names=keep)) if keep else "pass"))
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
    bare = False
    for call in spec.calls:
        attr = spec.modules[call.module].attr
        if call.target:
            top = next(s for s in tree.body if s.lineno <= call.span[0] <= s.end_lineno)
            start, end, lines = span((top.lineno, top.col_offset, top.end_lineno, top.end_col_offset))
            text = f"from cuda_extension import {attr} as {call.target}" if attr else \
                f"import cuda_extension as {call.target}"
            edits.append((start, end, text + "\n" * lines))
        else:
            start, end, lines = span(call.span)
            edits.append((start, end, f"(cuda_extension{'.' + attr if attr else ''})" + "\n" * lines))
            bare = True
    if bare:
        first = _first_statement(tree)
        at = starts[first.lineno] if first is not None else len(data)
        compound = first is not None and isinstance(first, (ast.ClassDef, ast.FunctionDef, ast.If, ast.With, ast.For,
                                                            ast.Try, ast.AsyncFunctionDef, ast.While))
        edits.append((at, at, "import cuda_extension\n" if compound or first is None else "import cuda_extension; "))
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        data = data[:start] + text.encode() + data[end:]
    rewritten = data.decode()
    try:
        ast.parse(rewritten)
    except SyntaxError as exc:
        raise UnsupportedInline(f"the call site cannot be rewritten: {exc}") from None
    return rewritten
