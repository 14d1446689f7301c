"""A password hasher for the test process: Django's PBKDF2 at one iteration.

Django's own takes a million iterations, half a second on our machines, and most tests make two or three people
and log one in: that alone was a quarter of a whole run. The hash keeps Django's format (`pbkdf2_sha256$1$...`),
so the portal's own processes in a test (daphne, the workers) check these passwords with their default hashers,
and upgrade a person's hash to the full count at their first login there, as Django does for any old hash.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1
