"""Single-file solutions: one model_new.py that calls `load_inline` at import.

`extract` reads the calls' arguments from the AST without running anything (`fold` evaluates
constant expressions over the names `bindings` tracks; `settings` finds an `os` import used only
for the build settings it ignores), `rewrite` replaces each call by the
prebuilt module, `sources` writes what load_inline would have compiled, `checks` applies the
static rules to the extracted device code, and `prepare` ties them into a workspace build. The
compiling itself is `build/`, as for any workspace.
"""
