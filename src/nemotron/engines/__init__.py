"""Engines: who trains a compiled Job. One class per engine behind `Engine`, chosen by the config's `backend`."""
