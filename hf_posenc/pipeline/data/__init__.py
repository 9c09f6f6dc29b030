"""Data: parallel text from local files (plain or gzip) or HF `datasets` (`files.py`), validated with errors
that name the file and the counts; the joint BPE (`tokenization.py`); the tokenised training corpus, built once
per data and settings into an Arrow cache and read without holding it in memory (`corpus.py`), whose entries are
written whole, checked and named when damaged (`cache.py`); token-budget
batches (`batching.py`); and the concatenation augmentation that joins consecutive pairs into longer examples
(`augmentation.py`). A new data source is a function beside `iter_parallel` and `stream_hf_translation`."""
