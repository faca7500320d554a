"""The package's version, in one place below every room: the package root re-exports it, and the code that
`sharing.saving` writes into checkpoints records it."""

__version__ = "0.1.0"
