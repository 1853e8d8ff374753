"""Images as files: OCI layouts, layer normalization, tar streams, verify and diff, SBOMs.

    oci.py        an engine image written as a deterministic OCI layout, and a layout read back
    index.py      several platforms' images as one layout under an OCI image index, and such a layout read back
    normalize.py  a layer tar rewritten so two builds of one lock give the same bytes
    tarstream.py  tar headers read and written one at a time, for filters over gigabytes
    verify.py     an image's files against its lock (labels, versions, RECORD hashes), and diff
    sbom.py       the CycloneDX SBOM of an image, from its lock

May import: engine (to read an image out of it), lock, render's label names, common, errors.
No registry or CLI code.
"""
