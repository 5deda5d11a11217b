"""Investigations: scripts that answered one question while the project was built (a crash hunt,
which model shape pays, where a loop's time goes, the Pallas kernel's offline GPU lowering). Their
findings are in BUILD_NOTES.md and docs/decisions.md; they are kept runnable, not maintained as
tools (``python -m experiments.investigations.NAME --help``)."""
