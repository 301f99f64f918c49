"""Decontamination: how close a candidate task's source is to any KernelBench problem.

What it is: a structural fingerprint of a KernelBench-format source and the comparisons built on
it. The paper drops a training task whose AST similarity to any KernelBench task exceeds 0.9
(CUDA Agent paper, data synthesis: decontamination); this module is that filter.
What it is not: a semantic equivalence check; two programs computing the same thing with
different structure score low.

The fingerprint: parse with `ast`, drop docstrings, walk the tree in pre-order and emit one token
per node: its type name, with local identifiers (variables, functions, arguments, classes,
`self.<attribute>`) replaced by placeholders numbered by first appearance within each scope
(module, class, function) and every constant by its type (`NUM`, `STR`). Names that reach torch keep their text (`torch.relu`, `nn.Conv2d`,
`F.gelu`, tensor methods like `.view`), so a conv and a softmax differ even though both are
"call an attribute". Similarity is difflib's `SequenceMatcher.ratio` (2*matches / total length)
on the two token sequences, with autojunk off: order-aware, 1.0 for a renamed and resized copy.
`quick_ratio` is an upper bound of `ratio`, so `nearest` skips corpus entries that cannot win.

`operator_signature` is coarser: the torch ops and modules a Model's forward calls, in order;
an exact match with a KernelBench problem is reported separately from the similarity score.

Example:
    corpus = build_corpus(load_kernelbench(".../problems.jsonl", levels={1, 2, 3}).tasks)
    kept, dropped = decontaminate(tasks, corpus, threshold=0.9)
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable, Sequence

import msgspec
from msgspec import Struct

from rewards.inline.fold import dotted

from agentcore.types import Task

TORCH_ROOTS = frozenset({"torch", "nn", "F", "math"})
"""Module names whose attribute chains are API names, kept verbatim (after alias resolution)."""


class Fingerprint(Struct, frozen=True, kw_only=True):
    """A problem's normalised AST token sequence and operator signature."""

    task_id: str
    tokens: tuple[str, ...]
    signature: tuple[str, ...]


class Dropped(Struct, frozen=True, kw_only=True):
    """A task decontamination removed, and why."""

    task_id: str
    reason: str  # "similarity" | "signature" | "unparsable"
    nearest_id: str
    similarity: float
    signature_matches: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# Normalisation


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> canonical module path, e.g. `F` -> `torch.nn.functional`."""
    aliases = {"torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional", "math": "math"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _dotted(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"], or None if the chain does not start at a plain name."""
    name = dotted(node, {})
    return name.split(".") if name else None


def _strip_docstrings(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]


class _Tokenizer:
    def __init__(self, aliases: dict[str, str]):
        self.aliases = aliases
        self.names: dict[str, str] = {}
        self.tokens: list[str] = []

    def placeholder(self, name: str) -> str:
        # Numbered by first appearance within the current scope (module, class, function), so
        # dataflow inside a function is kept but a copy whose module-level sizes no longer share
        # names with __init__'s arguments still matches.
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit(self, node: ast.AST) -> None:
        chain = _dotted(node) if isinstance(node, ast.Attribute) else None
        if chain and chain[0] in self.aliases and chain[0] not in self.names:
            self.tokens.append(".".join([self.aliases[chain[0]], *chain[1:]]))  # torch API: verbatim
            return
        if isinstance(node, ast.Name):
            root = node.id in self.aliases and node.id not in self.names
            self.tokens.append(self.aliases[node.id] if root else self.placeholder(node.id))
            return
        if isinstance(node, ast.Constant):
            self.tokens.append("STR" if isinstance(node.value, str) else "NUM")
            return
        if isinstance(node, ast.Attribute):
            # `self.conv` is a user name; `x.view` is an API method.
            user = isinstance(node.value, ast.Name) and node.value.id == "self"
            self.tokens.append("." + (self.placeholder(node.attr) if user else node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            self.tokens.append(f"{type(node).__name__}:{self.placeholder(node.name)}")
            outer, self.names = self.names, {}
            for child in ast.iter_child_nodes(node):
                if child is not getattr(node, "returns", None):
                    self.visit(child)
            self.names = outer
            return
        elif isinstance(node, ast.arg):
            self.tokens.append(f"arg:{self.placeholder(node.arg)}")
            return  # annotations are noise shared by every problem
        elif isinstance(node, ast.keyword):
            self.tokens.append(f"kw:{node.arg}")  # keyword names are API (dim=, kernel_size=)
        elif isinstance(node, (ast.Import, ast.ImportFrom, ast.Load, ast.Store, ast.Del)):
            return
        else:
            self.tokens.append(type(node).__name__)
        for child in ast.iter_child_nodes(node):
            self.visit(child)


def normalized_tokens(source: str) -> tuple[str, ...]:
    """The placeholder-normalised pre-order node sequence of `source` (raises SyntaxError)."""
    tree = ast.parse(source)
    _strip_docstrings(tree)
    tokenizer = _Tokenizer(_import_aliases(tree))
    tokenizer.visit(tree)
    return tuple(tokenizer.tokens)


def similarity(candidate: str | Sequence[str], reference: str | Sequence[str]) -> float:
    """SequenceMatcher ratio of two sources (or token sequences) after normalisation, in [0, 1].

    The ratio is not quite symmetric (the matching blocks found depend on the order); the
    argument order here is the one `nearest` uses, so the two agree.
    """
    tc = normalized_tokens(candidate) if isinstance(candidate, str) else candidate
    tr = normalized_tokens(reference) if isinstance(reference, str) else reference
    return difflib.SequenceMatcher(None, tr, tc, autojunk=False).ratio()


# ---------------------------------------------------------------------------------------------
# Operator signature


def _model_class(tree: ast.Module) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)


def _postorder_calls(node: ast.AST) -> Iterable[ast.AST]:
    """Calls and arithmetic in evaluation order: arguments before the call that uses them."""
    for child in ast.iter_child_nodes(node):
        yield from _postorder_calls(child)
    if isinstance(node, (ast.Call, ast.BinOp)):
        yield node


def operator_signature(source: str) -> tuple[str, ...]:
    """The torch ops/modules `Model.forward` uses, in order, e.g. ("torch.nn.Conv2d", "torch.relu")."""
    tree = ast.parse(source)
    aliases = _import_aliases(tree)
    cls = _model_class(tree)
    if cls is None:
        return ()
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    submodules: dict[str, str] = {}  # self.<attr> -> "torch.nn.Conv2d"
    for node in ast.walk(methods.get("__init__", ast.Pass())):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            ctor = _dotted(node.value.func)
            for target in node.targets:
                t = _dotted(target)
                if ctor and t and t[0] == "self" and len(t) == 2 and ctor[0] in aliases:
                    submodules[t[1]] = ".".join([aliases[ctor[0]], *ctor[1:]])
    ops = []
    for node in _postorder_calls(methods.get("forward", ast.Pass())):
        if isinstance(node, ast.BinOp):
            ops.append(type(node.op).__name__)
            continue
        chain = _dotted(node.func)
        if chain is None:
            continue
        if chain[0] == "self" and len(chain) == 2 and chain[1] in submodules:
            ops.append(submodules[chain[1]])
        elif chain[0] in aliases and chain[0] != "self":
            ops.append(".".join([aliases[chain[0]], *chain[1:]]))
        elif len(chain) >= 2:
            ops.append("Tensor." + chain[-1])  # a method on a tensor: x.view, x.sum
    return tuple(ops)


# ---------------------------------------------------------------------------------------------
# Corpus queries


def fingerprint(task: Task) -> Fingerprint:
    return Fingerprint(task_id=task.task_id, tokens=normalized_tokens(task.source), signature=operator_signature(task.source))


def build_corpus(tasks: Iterable[Task]) -> tuple[Fingerprint, ...]:
    """Fingerprints of the reference problems (KernelBench levels 1-3), computed once."""
    return tuple(fingerprint(t) for t in tasks)


def _as_corpus(corpus: Sequence[Fingerprint] | Sequence[Task]) -> Sequence[Fingerprint]:
    return [c if isinstance(c, Fingerprint) else fingerprint(c) for c in corpus]


def nearest(candidate: str, corpus: Sequence[Fingerprint] | Sequence[Task]) -> tuple[str, float]:
    """(task_id, similarity) of the corpus problem most similar to `candidate`'s source."""
    tokens = normalized_tokens(candidate)
    best_id, best = "", 0.0
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(tokens)  # seq2 is the one SequenceMatcher indexes: reuse it across the corpus
    ranked = []
    for fp in _as_corpus(corpus):
        matcher.set_seq1(fp.tokens)
        ranked.append((matcher.quick_ratio(), fp))
    ranked.sort(key=lambda pair: -pair[0])
    for upper, fp in ranked:
        if upper <= best:
            break  # quick_ratio bounds ratio from above: nothing further can win
        matcher.set_seq1(fp.tokens)
        score = matcher.ratio()
        if score > best:
            best_id, best = fp.task_id, score
    return best_id, best


def signature_matches(candidate: str, corpus: Sequence[Fingerprint] | Sequence[Task]) -> tuple[str, ...]:
    """Ids of corpus problems whose operator signature equals `candidate`'s exactly (empty ones never match)."""
    sig = operator_signature(candidate)
    if not sig:
        return ()
    return tuple(fp.task_id for fp in _as_corpus(corpus) if fp.signature == sig)


def decontaminate(
    tasks: Iterable[Task],
    corpus: Sequence[Fingerprint] | Sequence[Task],
    threshold: float = 0.9,
    *,
    drop_signature_matches: bool = False,
) -> tuple[list[Task], list[Dropped]]:
    """Drop tasks whose similarity to any corpus problem exceeds `threshold`.

    Kept tasks carry `nearest_kernelbench`, `kernelbench_similarity` and `signature_match` (ids,
    comma-joined) in their metadata; exact operator-signature matches are dropped only when
    `drop_signature_matches` is set.
    """
    corpus = _as_corpus(corpus)
    kept: list[Task] = []
    dropped: list[Dropped] = []
    for task in tasks:
        try:
            near_id, score = nearest(task.source, corpus)
            matches = signature_matches(task.source, corpus)
        except SyntaxError:
            dropped.append(Dropped(task_id=task.task_id, reason="unparsable", nearest_id="", similarity=0.0))
            continue
        if score > threshold or (drop_signature_matches and matches):
            reason = "similarity" if score > threshold else "signature"
            dropped.append(Dropped(task_id=task.task_id, reason=reason, nearest_id=near_id, similarity=score, signature_matches=matches))
            continue
        meta = {**task.metadata, "nearest_kernelbench": near_id, "kernelbench_similarity": round(score, 4), "signature_match": ",".join(matches)}
        kept.append(msgspec.structs.replace(task, metadata=meta))
    return kept, dropped
