"""The semantic stage: an answer for a request close in meaning to one already answered.

``scope`` (which requests may share an answer, and the text that is embedded), ``index`` (the
in-memory nearest-neighbour index per scope), ``store`` (entries, vectors and the index change
stream in Redis), ``cache`` (SemanticCache: lookup and store over the three, the index kept in
step across workers). Whether a near match may be served is decided in cache/verify/. Nothing
is imported here: import the submodule you need."""
