"""The similarity kit that decontam and dedup share: how texts are normalised, hashed, embedded,
searched and compared. It knows texts and vectors, not data steps: nothing here imports
rufus_data.decontam, dedup, mix or rollouts.

    textnorm.py           the one normalisation of words (NFKC, lowercase, ...)
    ngram_hash.py         64-bit word ids and n-gram hashes; 32-bit shingles for MinHash
    minhash_lsh.py        MinHash signatures (datasketch's) and LSH band keys and index
    embedding.py          the offline text embedders (wordllama; sentence-transformers on request)
    vector_search.py      top-k cosine search, exact or clustered
    semantic_evidence.py  what a rewording keeps: quantities, rare content words, entities
    text_fields.py        which columns of a canonical row hold the texts compared"""


# The default embedder, named here (not in embedding.py, which loads numpy, arrow and a tokenizer)
# so that the decontam and dedup settings, and the command-line options built from them, load none.
DEFAULT_EMBEDDER = "wordllama"
