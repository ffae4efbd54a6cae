"""The replay lab: replay recorded sessions against drafters and report what each buys.

`simulator` (steps and batching), `oracle` (the bound), `records` (what is replayed and
written), `registry` (drafter names), `run` (a whole run folder), `report` and `plots`.
"""
