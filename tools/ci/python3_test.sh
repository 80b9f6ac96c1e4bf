#!/usr/bin/env bash
# Runs a Python unittest file (its path is the first argument) with python3.
exec python3 "$1"
