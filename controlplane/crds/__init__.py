"""CustomResourceDefinitions (apiextensions.k8s.io/v1), served as kube-apiserver's apiextensions-apiserver does.

- `schema.py`: structural OpenAPI v3 schemas: validation, pruning, defaulting (pure);
- `definition.py`: a CRD's own validation and what it serves (`CustomKind`, the hooks the store calls);
- `columns.py`: additionalPrinterColumns (JSONPath cells) and the Table rows;
- `scale.py`: the scale subresource;
- `manager.py`: the controller inside the server that establishes CRDs (names, conditions) and removes them.
"""
