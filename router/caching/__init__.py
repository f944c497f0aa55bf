"""The router's side of the response cache: which requests may be cached (policy), shadow
verification of semantic hits, and predictive cache warming."""
