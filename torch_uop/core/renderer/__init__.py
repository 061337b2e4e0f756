"""Renderers: a linear UOp program -> source text for one device (LLVM IR today)."""
