"""The NumPy core: examples, plans and policies, packed batches and the permission.

Nothing here imports torch, pyarrow or any other heavy dependency; every
other layer (``io``, ``pipeline``, ``nn``, ``training``, ``hf``, ``ray``)
builds on these arrays. The names a user needs are re-exported by :mod:`exactpack`; the
rest are imported from their modules (``from exactpack.core.plan import Plan``).
"""
