"""python -m reference: the calibration table behind the default capacity."""
from .capacity import print_calibration_table

print_calibration_table()
