"""Scale data: ``manage.py scale_fill`` fills PostgreSQL with a busy team's year (plan.py says
how much; content.py what the rows hold; copy.py how they are written; fill.py in what order).
"""
