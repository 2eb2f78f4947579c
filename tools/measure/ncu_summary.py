#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV (gpu__time_duration.sum, dram__bytes_read.sum): one line per
kernel with its time, the DRAM bytes it read and the rate, then the sum."""
import csv
import re
import sys

rows = {}
order = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    key = (r["ID"], re.sub(r"\(.*", "", r["Kernel Name"]).split("::")[-1][:40])
    if key not in rows:
        rows[key] = {}
        order.append(key)
    value = float(r["Metric Value"].replace(",", ""))
    unit = r["Metric Unit"]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "byte": 1e-6, "Kbyte": 1e-3,
             "Mbyte": 1.0, "Gbyte": 1e3}.get(unit, 1.0)
    rows[key][r["Metric Name"]] = value * scale
total_us = total_mb = 0.0
for key in order:
    us = rows[key].get("gpu__time_duration.sum", 0.0)
    mb = rows[key].get("dram__bytes_read.sum", 0.0)
    total_us += us
    total_mb += mb
    print(f"  {key[1]:40s} {us:8.1f} us {mb:8.2f} MB {mb / us if us else 0:6.2f} TB/s")
print(f"  {'sum':40s} {total_us:8.1f} us {total_mb:8.2f} MB")
