"""Reading a study's run files: one rule for an unreadable file, shared by the reports."""
import json


def read_json(path):
    """(the file's JSON, None), or (None, why) when it cannot be read or parsed: a report lists the
    file as left out with that reason instead of stopping."""
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"unreadable ({e})"
