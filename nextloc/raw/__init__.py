"""Raw data: find GeoLife on this machine, download or unpack it safely, take in new dumps, report duplicates.

- :mod:`~nextloc.raw.rawdata`: where the raw data is (``$NEXTLOC_GEOLIFE_DIR``, ``data/raw/geolife``, an
  archive, or the official zip).
- :mod:`~nextloc.raw.download`: the GeoLife 1.3 zip, fetched and unpacked.
- :mod:`~nextloc.raw.http_download`: one file over HTTP, resumed, retried, checked (standard library only).
- :mod:`~nextloc.raw.archives`: zip and tar unpacking that never writes outside its folder.
- :mod:`~nextloc.raw.dumps`: new trajectory dumps: found, fingerprinted, checked, merged into the raw store.
- :mod:`~nextloc.raw.duplicates`: trajectory files held under several users, reported (or kept once).
"""
