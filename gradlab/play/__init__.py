"""The web player's server side (``gradlab play``): not built yet.

docs/ARCHITECTURE.md section 12 describes it; no issue has asked for it so far.
"""
