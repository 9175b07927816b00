"""The one exception type for bad input a user can fix.

Contract: the message is a single line that names the file or config key at fault and says how to
fix it. Entry points (train.py, data_tools, vitlarge.evaluate) print it as ``error: <message>`` and
exit with status 2, without a traceback.
"""


class UserError(Exception):
    """Bad input: a missing file, a wrong key, a value out of range. Message names it and the fix."""
