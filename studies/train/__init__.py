"""The training driver (train.py), its models (digits.py, charlm.py) and reducers."""
