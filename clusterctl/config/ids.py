"""A job's name and id: the rules, once.

``spec`` checks the name a user writes; ``state`` the name it stores; ``plan`` and ``paths`` the id they are given
(an id names the job's containers and its state directory, so it must be a safe path element).
"""
from __future__ import annotations

import re

# A job name: lowercase letters, digits and '-', starting with a letter or digit, at most 63 characters.
JOB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# A job id: ``<name>-<YYYYmmdd-HHMMSS>-<12 hex>`` as the store makes it (``<4 hex>`` before issue 24: 16 random bits
# a second collided across state dirs; old ids still match), or ``<name>-DRYRUN`` for a plan. Checked
# loosely (letters, digits, '_', '.', '-'; no separators, no leading dot): callers refuse '..' where it matters.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
ID_RANDOM_BYTES = 6     # the id's random part: 12 hex digits
