"""Images as files: OCI layouts written and read back, layer normalization, tar streams, verify and
diff, SBOMs.

    oci.py        the OCI format: media types (OCI's and Docker's), descriptors, platforms, the JSON of
                  index.json, a manifest and an image index checked, blobs written and read by digest
    layout.py     the one layout reader: the image (a manifest, or an index and its platforms'
                  manifests) and its SBOM artifacts, every manifest checked against its digest
    export.py     an engine image written as a deterministic OCI layout
    index.py      several platforms' images as one layout under an OCI image index, and such a layout read back
    normalize.py  a layer tar rewritten so two builds of one lock give the same bytes
    compression.py  gzip (default) or zstd layer blobs, written the same way every time, and read back
    tarstream.py  tar headers read and written one at a time, for filters over gigabytes
    verify.py     an image's files against its lock (labels, versions, RECORD hashes), and diff
    sbom.py       the CycloneDX SBOM of an image, from its lock, attached to its layout

May import: engine (to read an image out of it), lock, render's label names, common, errors.
No registry or CLI code.
"""
