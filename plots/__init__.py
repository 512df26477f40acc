"""Figures over run directories; reads files only, never trains and never imports MPI."""
