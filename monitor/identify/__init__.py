"""identify"""
