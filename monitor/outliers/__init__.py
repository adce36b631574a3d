"""outliers"""
