"""Data, torch-free: everything about token files, text and tokenizers that both the plan and
the worker need, so that neither imports the other for it.

* :mod:`olmx.data.files`: finding token files (OLMo-core's ``.npy`` arrays, raw token files)
  and text files, their dtypes, and the cache of text tokenized at run time;
* :mod:`olmx.data.tokenizer`: a ``tokenizer.json`` read as JSON (vocabulary size, special ids,
  fingerprint) and the run's tokenizer settings resolved and checked;
* :mod:`olmx.data.encode`: encoding text with Hugging Face ``tokenizers`` (or bytes);
* :mod:`olmx.data.splits`: the held-out split and the mixture's sources, from token counts;
* :mod:`olmx.data.tokenize`: ``olmx data tokenize``, text to OLMo-core token files;
* :mod:`olmx.data.checks`: the plan's checks of the data and evaluation settings and files.

The worker keeps only what builds OLMo-core datasets (:mod:`olmx.worker.datasets`). Nothing
here imports torch or OLMo-core.
"""
